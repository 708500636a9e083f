"""The model behind a verifiers rollout: reinforge's episode client, call by call.

verifiers runs a rollout as a program (its harness) that calls a chat-completions endpoint
served by verifiers' interception server, and the server hands each call to a `Client`
chosen by the type of the rollout's client config. A `PolicyClientConfig` names one
reinforge rollout (its `Conversation`), and verifiers gets a `PolicyClient` for it, which
answers every call from that rollout's episode client: the tokens are sampled, and
recorded, the way every reinforge environment's are.

The episode client's record is the truth. A call must repeat the conversation the episode
client has seen, message for message as verifiers identifies messages (role, content,
tool calls), and may add messages after it: tool results, a user's turn. Those new
messages go to the episode client after the exact tokens so far, so no earlier turn is
rendered again. A call that changes an earlier message (a harness that compacts its
context or drops a reply's reasoning) is refused: the policy would otherwise train on
tokens it did not sample after what it saw. The refusal fails the rollout with the reason.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.clients.train import serialize_completion, tool_to_wire
from verifiers.v1.dialects import ChatDialect, Dialect
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.errors import ProviderError
from verifiers.v1.graph import PendingTurn, message_hash
from verifiers.v1.interception import server as interception

from reinforge.policy.chat import parse_tool_calls
from reinforge.policy.client import ChatClient, EpisodeLimit
from reinforge.types import Message

LIMIT_MARKER = "context_length_exceeded"
"""In the message of a call refused at the episode's limits: verifiers' chat harnesses
read it as a full context and end their run cleanly, so the rollout is scored as far as
it got (and counts as truncated)."""


class Conversation:
    """One rollout's calls, as its episode client saw them."""

    def __init__(self, client: ChatClient, max_turns: int, max_tokens_per_turn: int) -> None:
        self.client = client
        self.max_turns = max_turns
        self.max_tokens_per_turn = max_tokens_per_turn
        self.messages: list[Message] = []
        """What the episode client was sent, each reply included, as it was sent."""
        self.tools: list[dict[str, Any]] | None = None
        """The tool schemas of the last call: what the policy was offered."""
        self.turns = 0
        self.tool_calls = 0
        self.truncated = False
        """A call was refused at the episode's turn or token limit."""
        self.refusal: str | None = None
        """Why a call was refused: it changed the conversation so far, or it came from a
        second agent run."""
        self._session: str | None = None
        """The verifiers trace whose calls these are."""
        self._seen: list[str] = []
        """verifiers' identity (`message_hash`) of each message in `messages`."""

    async def respond(
        self, request: vf.Request, model: str, max_tokens: int | None, session: str | None
    ) -> vf.Response:
        """The policy's reply to one call of the trace `session`, recorded; `max_tokens` is
        the harness's own cap."""
        if self._session is None:
            self._session = session
        elif session != self._session:
            self.refusal = (
                "a second agent run called the policy; reinforge trains on episodes of one "
                "(verifiers' best-of-n and user-sim play more)"
            )
            raise ProviderError(self.refusal, status_code=400)
        hashes = [message_hash(m) for m in request.messages]
        if hashes[: len(self._seen)] != self._seen:
            changed = next(
                (i for i, (a, b) in enumerate(zip(hashes, self._seen, strict=False)) if a != b),
                len(hashes),
            )
            self.refusal = (
                f"call {self.turns + 1} changed the conversation the policy has seen, from "
                f"its message {changed + 1} on; reinforge trains only on tokens sampled after "
                "exactly what came before, so use a harness that keeps the conversation"
            )
            raise ProviderError(self.refusal, status_code=400)
        if self.turns >= self.max_turns:
            self.truncated = True
            raise ProviderError(
                f"{LIMIT_MARKER}: the episode took its {self.turns} turns", status_code=400
            )
        tail = request.messages[len(self._seen) :]
        messages = [*self.messages, *(message_to_wire(m) for m in tail)]
        tools = [tool_to_wire(t) for t in request.tools] if request.tools else None
        limit = min(max_tokens or self.max_tokens_per_turn, self.max_tokens_per_turn)
        try:
            reply = await self.client.chat(messages, tools, limit)
        except EpisodeLimit as error:
            self.truncated = True
            raise ProviderError(f"{LIMIT_MARKER}: {error}", status_code=400) from error
        answer = _assistant(reply.message)
        self.messages = [*messages, reply.message]
        self._seen = [*hashes, message_hash(answer)]
        self.tools = tools
        self.turns += 1
        self.tool_calls += len(reply.tool_calls)
        finish = "tool_calls" if answer.tool_calls else "length" if reply.truncated else "stop"
        return vf.Response(
            id=f"reinforge-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=model,
            message=answer,
            finish_reason=finish,
        )


def _assistant(message: Message) -> vf.AssistantMessage:
    """The reply as an OpenAI server shows it: tool-call markup out of the text, the calls
    parsed beside it."""
    calls = message.get("tool_calls") or []
    text = message.get("content") or ""
    return vf.AssistantMessage(
        content=parse_tool_calls(text).content if calls else text,
        tool_calls=[
            vf.ToolCall(
                id=call["id"],
                name=call["function"]["name"],
                arguments=call["function"]["arguments"],
            )
            for call in calls
        ]
        or None,
    )


class PolicyClientConfig(vf.TrainClientConfig):
    """A verifiers client config naming one reinforge rollout. A train config, as the
    policy's tokens are what is recorded: verifiers then serves a harness's streamed call
    from the whole reply rather than relaying a provider's stream."""

    route: str
    base_url: str = "http://reinforge-policy.invalid/v1"
    """Never called: the policy is reached through `route`."""
    api_key_var: str = "REINFORGE_POLICY_KEY"


class PolicyClient(vf.Client):
    """verifiers' client of one rollout's policy."""

    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation

    async def get_response(
        self,
        dialect: Dialect,
        body: dict,
        sampling: vf.SamplingConfig,
        session_id: str | None = None,
        turn: PendingTurn | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> vf.Response:
        if not isinstance(dialect, ChatDialect):
            raise ProviderError(
                f"reinforge serves harnesses that speak chat completions; this one speaks "
                f"{type(dialect).__name__}",
                status_code=400,
            )
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        response = await self.conversation.respond(
            dialect.parse_request(body), body["model"], max_tokens, session_id
        )
        response.raw = serialize_completion(response, body["model"])
        return response


_ROUTES: dict[str, Conversation] = {}


@contextmanager
def policy_route(conversation: Conversation) -> Iterator[PolicyClientConfig]:
    """A client config whose calls `conversation` answers, for as long as the context
    lasts."""
    _install()
    route = uuid.uuid4().hex
    _ROUTES[route] = conversation
    try:
        yield PolicyClientConfig(route=route)
    finally:
        del _ROUTES[route]


def _install() -> None:
    """Have verifiers' interception server build a `PolicyClient` for a
    `PolicyClientConfig`: it builds its clients with `resolve_client`, which knows only
    verifiers' own configs, and every other config still goes to it."""
    if getattr(interception.resolve_client, "reinforge", False):
        return
    resolve = interception.resolve_client

    def resolve_client(config: vf.BaseClientConfig) -> vf.Client:
        if isinstance(config, PolicyClientConfig):
            return PolicyClient(_ROUTES[config.route])
        return resolve(config)

    resolve_client.reinforge = True  # type: ignore[attr-defined]
    interception.resolve_client = resolve_client
