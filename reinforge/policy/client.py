"""The policy client: OpenAI's own client, plus the bookkeeping that keeps episodes exact.

`PolicyClient` holds one connection (to a URL, or to an in-process engine through the
same FastAPI app over an ASGI transport, so both take one code path) and the sampling
settings of the rollouts it serves. Each rollout gets an `EpisodeClient`, which sends every
turn after the first as a continuation of the exact tokens so far and records what the
policy sampled.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import openai

from reinforge.errors import UsageError
from reinforge.policy.config import SamplingConfig, ServerConfig
from reinforge.types import Message


class EpisodeLimit(Exception):
    """The episode ran out of context or token budget: it ends as truncated."""


class EpisodeMisuse(Exception):
    """The environment broke the episode's token record (e.g. rewrote earlier turns)."""


@dataclass
class Reply:
    """One assistant turn."""

    message: Message
    """The assistant message to append to the conversation: raw sampled text as content
    (tool-call markup included, so the history renders as sampled) and parsed tool calls."""
    finish_reason: str
    """OpenAI's, or reinforge's "loop": the engine stopped a turn whose tail loops
    (`stop_loops`)."""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    """The tokens of the prompt it answered (0 where the server does not say)."""

    @property
    def text(self) -> str:
        return self.message.get("content") or ""

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.message.get("tool_calls") or []

    @property
    def truncated(self) -> bool:
        """Cut off by a limit or stopped in a loop: either way the turn is unfinished."""
        return self.finish_reason in ("length", "loop")


@dataclass
class Turn:
    prompt_ids: list[int]
    reply: Reply


class ChatClient(Protocol):
    """What an environment's rollout talks to: one episode's chat."""

    async def chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
    ) -> Reply:
        """`max_tokens` None: the server's default."""
        ...


@dataclass
class Traffic:
    """The requests a client has sent its engine: what a `Router` balances by
    (`in_flight`) and a run's metrics report."""

    in_flight: int = 0
    requests: int = 0
    """Answered."""
    sampled_tokens: int = 0
    """In the answers."""


class EpisodeSource(Protocol):
    """What rollouts sample from: one engine's `PolicyClient`, or a `Router` over several."""

    def episode(self, max_total_tokens: int | None, seed: int | None) -> EpisodeClient: ...


class PolicyClient:
    def __init__(
        self, openai_client: openai.AsyncOpenAI, model: str, sampling: SamplingConfig
    ) -> None:
        self.openai = openai_client
        self.model = model
        self.sampling = sampling
        self.traffic = Traffic()

    @classmethod
    def for_engine(cls, engine: Any, sampling: SamplingConfig) -> PolicyClient:
        """A client of an in-process engine, through the server's own request handling."""
        from reinforge.policy.server import create_app

        app = create_app(engine, ServerConfig(sampling=sampling))
        transport = httpx.ASGITransport(app=app)
        http = httpx.AsyncClient(transport=transport, base_url="http://engine/v1", timeout=None)
        client = openai.AsyncOpenAI(
            base_url="http://engine/v1", api_key="local", http_client=http, max_retries=0
        )
        return cls(client, engine.name, sampling)

    @classmethod
    async def for_url(
        cls,
        url: str,
        sampling: SamplingConfig,
        model: str | None = None,
        api_key: str = "EMPTY",
        max_retries: int = 2,
    ) -> PolicyClient:
        """A client of any OpenAI-compatible server; checks that it answers first."""
        # No deadline per request: each rollout has its own (`rollout.timeout_s`).
        client = openai.AsyncOpenAI(
            base_url=url, api_key=api_key, max_retries=max_retries, timeout=None
        )
        try:
            listed = [m.id async for m in client.models.list()]
        except openai.APIError as error:
            raise UsageError(
                f"cannot reach an OpenAI-compatible server at {url}: {error}"
            ) from error
        if model is None:
            if not listed:
                raise UsageError(f"the server at {url} lists no models; name one")
            model = listed[0]
        return cls(client, model, sampling)

    @classmethod
    def without_model(cls, name: str, sampling: SamplingConfig) -> PolicyClient:
        """A client that is never called: scripted agents act without a model, and `name`
        stands where a model's name would (in a run's summary)."""
        unused = openai.AsyncOpenAI(
            base_url="http://no-model.invalid/v1", api_key="-", max_retries=0
        )
        return cls(unused, name, sampling)

    def episode(self, max_total_tokens: int | None, seed: int | None) -> EpisodeClient:
        """A client for one rollout. Turn t samples with `seed + t`, so rollouts of one task
        differ yet repeat run to run; None: unseeded."""
        return EpisodeClient(lambda: self, max_total_tokens, seed)

    async def close(self) -> None:
        await self.openai.close()


class EpisodeClient:
    """Chat for one episode, recording each turn's exact tokens.

    After the first turn, `messages` must extend the previous call's messages plus the
    reply it returned; the earlier turns then travel as `prompt_token_ids` and are never
    re-rendered. The first turn asks `route` for the engine's client, and every later turn
    goes to the same one: that engine's prefix cache holds the conversation so far.

    A turn that cannot reach its engine (the process died) is handed to `lost`, where one
    is given: it returns once another engine serves, and the turn goes again to the one
    `route` gives then. Nothing of the failed request was recorded, and each turn sends
    the exact tokens so far, so the episode goes on as if it had been there all along.
    """

    def __init__(
        self,
        route: Callable[[], PolicyClient],
        max_total_tokens: int | None,
        seed: int | None,
        lost: Callable[[PolicyClient], Awaitable[None]] | None = None,
    ) -> None:
        self.route = route
        self.lost = lost
        self.policy: PolicyClient | None = None
        """The engine's client; None until the first turn."""
        self.max_total_tokens = max_total_tokens
        self.seed = seed
        self.turns: list[Turn] = []
        self.generate_s = 0.0
        """Seconds spent waiting on the policy."""
        self.turns_s: list[float] = []
        """Each answered turn's wait, its retries included."""
        self._sent: list[Message] = []

    @property
    def sampled_tokens(self) -> int:
        return sum(len(t.reply.token_ids) for t in self.turns)

    @property
    def loop_stops(self) -> int:
        """Turns the engine stopped because their tail looped (`stop_loops`)."""
        return sum(t.reply.finish_reason == "loop" for t in self.turns)

    async def chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
    ) -> Reply:
        if self.policy is None:
            self.policy = self.route()
        sampling = self.policy.sampling
        if self.max_total_tokens is not None:
            left = self.max_total_tokens - self.sampled_tokens
            if left <= 0:
                raise EpisodeLimit(f"the episode used its {self.max_total_tokens} tokens")
            max_tokens = left if max_tokens is None else min(max_tokens, left)
        extra: dict[str, Any] = {}
        continuation = self._continuation_tokens(messages)
        if continuation is not None:
            extra["prompt_token_ids"] = continuation
        if sampling.stop_loops:  # only when on: a server without the extension may refuse it
            extra["stop_loops"] = True
        seed = openai.omit if self.seed is None else self.seed + len(self.turns)
        request: dict[str, Any] = dict(
            messages=messages,
            tools=tools or openai.omit,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=openai.omit if max_tokens is None else max_tokens,
            seed=seed,
            logprobs=True,
            extra_body=extra or None,
        )
        waited = self.generate_s
        while True:
            policy = self.policy or self.route()
            try:
                response = await self._send(policy, request)
                break
            except openai.APIConnectionError:
                if self.lost is None:
                    raise
                self.policy = None
                await self.lost(policy)
        self.policy = policy
        self.turns_s.append(self.generate_s - waited)
        reply, prompt_ids = _reply(response)
        policy.traffic.requests += 1
        policy.traffic.sampled_tokens += len(reply.token_ids)
        self._record(messages, prompt_ids, reply)
        return reply

    async def _send(self, policy: PolicyClient, request: dict[str, Any]) -> Any:
        started = time.perf_counter()
        policy.traffic.in_flight += 1  # before any await: the next episode's route sees it
        try:
            return await policy.openai.chat.completions.create(model=policy.model, **request)
        except openai.BadRequestError as error:
            if _code(error) == "context_length_exceeded":
                raise EpisodeLimit(str(error)) from error
            raise
        finally:
            policy.traffic.in_flight -= 1
            self.generate_s += time.perf_counter() - started

    def _continuation_tokens(self, messages: list[Message]) -> list[int] | None:
        if not self.turns:
            return None
        last = self.turns[-1]
        history = [*self._sent, last.reply.message]
        if messages[: len(history)] != history:
            raise EpisodeMisuse(
                "messages must extend the previous turn's messages and reply unchanged; "
                "rewriting earlier turns would break the token record"
            )
        if not last.reply.token_ids:  # the server does not speak token ids
            return None
        return last.prompt_ids + last.reply.token_ids

    def _record(self, messages: list[Message], prompt_ids: list[int], reply: Reply) -> None:
        if self.turns and prompt_ids and self.turns[-1].reply.token_ids:
            previous = self.turns[-1].prompt_ids + self.turns[-1].reply.token_ids
            if prompt_ids[: len(previous)] != previous:
                raise EpisodeMisuse("the server did not continue from the exact tokens sent")
        self._sent = list(messages)
        self.turns.append(Turn(prompt_ids, reply))

    def token_record(self) -> tuple[list[int], list[int], list[float], list[int]]:
        """(token_ids, loss_mask, logprobs, policy_versions) of the whole episode."""
        if not self.turns or not self.turns[-1].reply.token_ids:
            return [], [], [], []
        last = self.turns[-1]
        token_ids = last.prompt_ids + last.reply.token_ids
        mask = [0] * len(token_ids)
        logprobs: list[float] = []
        versions: list[int] = []
        for turn in self.turns:
            start = len(turn.prompt_ids)
            mask[start : start + len(turn.reply.token_ids)] = [1] * len(turn.reply.token_ids)
            logprobs.extend(turn.reply.logprobs)
            versions.extend(turn.reply.policy_versions)
        return token_ids, mask, logprobs, versions


def _reply(response: Any) -> tuple[Reply, list[int]]:
    choice = response.choices[0]
    extra = choice.model_extra or {}
    token_ids = list(extra.get("token_ids") or [])
    content = extra.get("raw_text", choice.message.content)
    message: Message = {"role": "assistant", "content": content or ""}
    if choice.message.tool_calls:
        message["tool_calls"] = [call.model_dump() for call in choice.message.tool_calls]
    logprobs = [e.logprob for e in choice.logprobs.content] if choice.logprobs else []
    versions = list(extra.get("policy_versions") or [])
    if token_ids and len(logprobs) != len(token_ids):
        raise EpisodeMisuse("the server returned token ids and log-probs of different lengths")
    prompt_ids = list((response.model_extra or {}).get("prompt_token_ids") or [])
    prompt_tokens = response.usage.prompt_tokens if response.usage else len(prompt_ids)
    reply = Reply(message, choice.finish_reason, token_ids, logprobs, versions, prompt_tokens)
    return reply, prompt_ids


def _code(error: openai.APIStatusError) -> str | None:
    body = error.body if isinstance(error.body, dict) else {}
    inner = body.get("error", body) if isinstance(body, dict) else {}
    return inner.get("code") if isinstance(inner, dict) else None
