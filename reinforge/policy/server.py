"""OpenAI-compatible HTTP server over an Engine, with token-in/token-out extensions.

Extensions to OpenAI's schema (ignored by clients that do not know them):
- response `prompt_token_ids` and `policy_version`; each choice's `token_ids`,
  `policy_versions` (one per token) and `raw_text` (the completion as sampled, tool-call
  markup included, final EOS excluded). A stream carries them in each choice's last chunk;
- request `prompt_token_ids`: the exact tokens of the conversation so far, through the
  last assistant turn's sampled tokens. The server appends the template's tokens for the
  messages after the last assistant message, so earlier turns are never re-rendered.
  With no assistant message in `messages`, `prompt_token_ids` is the whole prompt;
- request `stop_loops`: end a choice as soon as its tail repeats itself, with finish
  reason `loop` (`policy/repetition.py` has the rule);
- `POST /v1/weights` `{"path", "version"}`: a trainer on this machine hands over new
  weights as a safetensors file (or, with `"buckets"`, as buckets' bytes and their
  manifest), with `server.weights_token` as its bearer token; they apply between two
  decode steps and requests in flight continue under them;
- `POST /v1/weights/group` `{"host", "port", "group", "rank", "size", "timeout_s"}` and
  `POST /v1/weights/broadcast` `{"group", "version", "buckets"}`, with the same token: the
  weights come as a broadcast over a process group of the trainer and its engines instead
  of a file (`weight_group.py`); these say which group, and each push's manifest;
- `POST /v1/pause` `{"lease_s"}` and `POST /v1/resume`, with the same token: decoding is
  held from the next step boundary until resume (or the lease's end); weights sent
  meanwhile apply inside the hold (`pause.py`).

`POST /v1/completions` with `echo` returns the prompt and its log-probs before the
completion's, and with `max_tokens: 0` scores the prompt alone (OpenAI's legacy call,
which vLLM's server also answers): what a distillation teacher is asked. Both routes take
vLLM's `prompt_logprobs`, and answer it in vLLM's shape.

Bad requests get OpenAI's error JSON with a 4xx status naming the field at fault; never a
traceback. A field the server does not take, or a value it cannot honour (a forced tool
call, a JSON response format, a penalty), is such a bad request, never ignored: the server
returns the tokens it sampled with the log-probs they were drawn with, so it does not
constrain or inject tokens to meet a request.

A body past `server.max_request_bytes` is refused before it is parsed, and prompts are
rendered and tokenised in a worker thread: a long one takes seconds, which `/health` and
every other request would otherwise wait out. The JSON of a choice is
`choices.py`'s, a stream's events `streaming.py`'s, the request models `requests.py`'s,
and the errors and the size guard `api_errors.py`'s. docs/server.md describes the API.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from safetensors import SafetensorError
from safetensors.torch import load_file

from reinforge.policy.api_errors import APIError, bad_request, install_guards
from reinforge.policy.backends import SamplingEngine
from reinforge.policy.chat import ChatFormat, TemplateError
from reinforge.policy.choices import ChoiceWriter, Json, Prompt, response
from reinforge.policy.config import ServerConfig
from reinforge.policy.engine_thread import Completion
from reinforge.policy.pause import Pause
from reinforge.policy.requests import (
    ChatRequest,
    CompletionRequest,
    GroupJoin,
    PauseRequest,
    WeightsBroadcast,
    WeightsUpdate,
    chat_messages,
    checked_tools,
    entries_of,
)
from reinforge.policy.sampling import SamplingParams
from reinforge.policy.streaming import stream
from reinforge.policy.weight_buckets import read
from reinforge.policy.weight_group import BroadcastAborted, WeightGroup

_Setting = TypeVar("_Setting", float, bool)
"""A sampling setting a request may leave to the server's config."""


def create_app(engine: SamplingEngine, config: ServerConfig) -> FastAPI:
    """The FastAPI app; also mounted in-process (httpx ASGI transport) by PolicyClient."""
    app = FastAPI(title="reinforge policy server")
    service = _Service(engine, config)
    pause = Pause(engine)
    group = WeightGroup(engine)
    writer = ChoiceWriter(engine.tokenizer, engine.eos_ids)
    install_guards(app, config.max_request_bytes)

    @app.get("/health")
    async def health() -> Json:
        return {
            "status": "ok",
            "model": engine.name,
            "policy_version": engine.version,
            "paused": pause.active,
        }

    @app.get("/v1/models")
    async def models() -> Json:
        card = {
            "id": engine.name,
            "object": "model",
            "created": 0,
            "owned_by": "reinforge",
            "max_model_len": engine.max_context,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: ChatRequest) -> Json | StreamingResponse:
        service.check(request)
        prompt_ids = await asyncio.to_thread(service.chat_prompt, request)
        params = service.sampling(request, prompt_ids)
        if request.stream:
            return stream(engine, writer, request, prompt_ids, params)
        prompt = await service.scored(request, prompt_ids)
        completions = await service.generate(prompt_ids, params)
        choices = [writer.chat_choice(i, c, request) for i, c in enumerate(completions)]
        body = response(
            "chat.completion", engine.name, engine.version, prompt_ids, completions, choices
        )
        if request.prompt_logprobs is not None:  # on the response, as vLLM's chat has them
            body["prompt_logprobs"] = writer.prompt_logprobs(prompt, request.prompt_logprobs)
        return body

    @app.post("/v1/completions", response_model=None)
    async def complete(request: CompletionRequest) -> Json | StreamingResponse:
        service.check(request)
        prompt_ids = await asyncio.to_thread(service.completion_prompt, request)
        if request.max_tokens == 0:  # echo: score the prompt, sample nothing
            service.check_prompt(prompt_ids, max_tokens=0)
            completions = [Completion([], [], [], "length") for _ in range(request.n)]
            prompt = await service.scored(request, prompt_ids)
        else:
            params = service.sampling(request, prompt_ids)
            if request.stream:
                return stream(engine, writer, request, prompt_ids, params)
            prompt = await service.scored(request, prompt_ids)
            completions = await service.generate(prompt_ids, params)
        choices = [writer.text_choice(i, c, request, prompt) for i, c in enumerate(completions)]
        return response(
            "text_completion", engine.name, engine.version, prompt_ids, completions, choices
        )

    @app.post("/v1/weights")
    async def weights(update: WeightsUpdate, request: Request) -> Json:
        service.authorize_weights(request)
        version = await asyncio.to_thread(pause.run, lambda: service.load_weights(update))
        return {"policy_version": version}

    @app.post("/v1/weights/group")
    async def join_weights_group(join: GroupJoin, request: Request) -> Json:
        service.authorize_weights(request)
        try:
            store_at, own = (join.host, join.port), config.host
            await asyncio.to_thread(
                group.join, store_at, own, join.group, join.rank, join.size, join.timeout_s
            )
        except RuntimeError as error:  # torch.distributed's: a rank or the store is gone
            message = f"could not join weights group {join.group}: {error}"
            raise APIError(409, message, code="group_failed") from error
        return {"group": join.group}

    @app.post("/v1/weights/broadcast")
    async def take_broadcast(update: WeightsBroadcast, request: Request) -> Json:
        service.authorize_weights(request)
        buckets = entries_of(update.buckets)
        try:
            version = await asyncio.to_thread(
                pause.run, lambda: group.receive(update.group, buckets, update.version)
            )
        except BroadcastAborted as error:
            raise APIError(409, str(error), code="broadcast_aborted") from error
        return {"policy_version": version}

    @app.post("/v1/pause")
    async def pause_decoding(hold: PauseRequest, request: Request) -> Json:
        service.authorize_weights(request)
        if not await asyncio.to_thread(pause.start, hold.lease_s):
            raise APIError(409, "decoding is already paused", code="already_paused")
        return {"paused": True, "policy_version": engine.version}

    @app.post("/v1/resume")
    async def resume_decoding(request: Request) -> Json:
        service.authorize_weights(request)
        return {"resumed": await asyncio.to_thread(pause.resume)}

    return app


class _Service:
    """The engine-bound work behind the routes, kept out of `create_app` so the app reads
    as wiring. Requests left without sampling settings take `config`'s."""

    def __init__(self, engine: SamplingEngine, config: ServerConfig) -> None:
        self.engine, self.config = engine, config
        self.tokenizer, self.chat_format = engine.tokenizer, ChatFormat(engine.tokenizer)

    def authorize_weights(self, request: Request) -> None:
        """Only a trainer on this machine that knows the configured secret may change the
        policy: anyone else could make every later rollout theirs."""
        token = self.config.weights_token
        if token is None:
            raise APIError(403, "this server takes no weight updates (server.weights_token)")
        host = request.client.host if request.client else ""
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise APIError(403, "weight updates are taken from this machine only")
        given = request.headers.get("authorization", "").removeprefix("Bearer ")
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise APIError(401, "wrong or missing weights token", code="invalid_api_key")

    def load_weights(self, update: WeightsUpdate) -> int:
        buckets = None if update.buckets is None else entries_of(update.buckets)
        try:
            state = load_file(update.path) if buckets is None else read(update.path, buckets)
        except (OSError, SafetensorError, ValueError, RuntimeError) as error:
            raise APIError(400, f"cannot read weights at {update.path}: {error}", "path") from error
        try:
            return self.engine.update_weights(state, update.version)
        except (KeyError, ValueError) as error:
            raise APIError(400, f"weights do not fit the model: {error}", "path") from error

    def check(self, request: ChatRequest | CompletionRequest) -> None:
        name = self.engine.name
        if request.model != name:
            raise APIError(
                404,
                f"The model '{request.model}' does not exist; this server serves '{name}'.",
                "model",
                "model_not_found",
            )
        limit = self.config.max_top_logprobs
        for field, asked in (
            (request.alternatives_field, request.alternatives),
            ("prompt_logprobs", request.prompt_logprobs or 0),
        ):
            if asked > limit:
                raise bad_request(
                    f"{field}={asked} is more than this server lists: at most {limit} "
                    "alternatives per token (server.max_top_logprobs)",
                    field,
                )
        request.check_supported()

    def chat_prompt(self, request: ChatRequest) -> list[int]:
        messages, previous = chat_messages(request.messages), request.prompt_token_ids
        tools = checked_tools(request.tools)
        if not request.offers_tools:  # tool_choice "none": the prompt shows no tools
            tools = None
        if previous is None and not messages:
            raise bad_request("messages must not be empty", "messages")
        try:
            if previous is None:
                return self.chat_format.prompt_ids(messages, tools)
            last = max(
                (i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None
            )
            if last is None:
                return previous
            ended_with_eos = bool(previous) and previous[-1] in self.engine.eos_ids
            return self.chat_format.continuation_ids(previous, messages[last + 1 :], ended_with_eos)
        except TemplateError as error:
            raise bad_request(str(error), "messages") from error

    def completion_prompt(self, request: CompletionRequest) -> list[int]:
        if request.prompt_token_ids is not None:
            return request.prompt_token_ids
        if isinstance(request.prompt, list):
            return request.prompt
        return self.tokenizer.encode(request.prompt, add_special_tokens=False)

    def sampling(
        self, request: ChatRequest | CompletionRequest, prompt_ids: list[int]
    ) -> list[SamplingParams]:
        """One setting per choice, checked against the prompt before anything is sampled
        (so that a stream never starts for a request that cannot be served)."""
        max_tokens = request.max_completion_tokens or request.max_tokens
        room = self.check_prompt(prompt_ids, max_tokens)
        return [
            SamplingParams(
                max_tokens=max_tokens or min(self.config.max_tokens, room),
                temperature=_given(request.temperature, self.config.sampling.temperature),
                top_p=_given(request.top_p, self.config.sampling.top_p),
                stop=tuple(request.stop or ()),
                seed=None if request.seed is None else request.seed + i,
                top_logprobs=request.alternatives,
                stop_loops=_given(request.stop_loops, self.config.sampling.stop_loops),
            )
            for i in range(request.n)
        ]

    def check_prompt(self, prompt_ids: list[int], max_tokens: int | None) -> int:
        """The context left after the prompt, which must hold `max_tokens` (None: one). The
        length first: a prompt of a million ids is refused before each is looked at."""
        if not prompt_ids:
            raise bad_request("the prompt is empty", "prompt")
        room = self.engine.max_context - len(prompt_ids)
        if room < (1 if max_tokens is None else max_tokens):
            raise APIError(
                400,
                f"This model's maximum context length is {self.engine.max_context} tokens; the "
                f"prompt has {len(prompt_ids)} and max_tokens asks for {max_tokens}.",
                "messages",
                "context_length_exceeded",
            )
        vocabulary = len(self.tokenizer)
        if any(not 0 <= t < vocabulary for t in prompt_ids):
            raise bad_request(
                "prompt_token_ids holds ids outside the vocabulary", "prompt_token_ids"
            )
        return room

    async def scored(
        self, request: ChatRequest | CompletionRequest, prompt_ids: list[int]
    ) -> Prompt:
        """The prompt, with its log-probs when the request asks for them: one forward, with
        the most alternatives any of its fields asks for."""
        k = request.prompt_alternatives
        if k is None:
            return Prompt(prompt_ids)
        return Prompt(prompt_ids, await self.engine.prompt_logprobs(prompt_ids, k))

    async def generate(
        self, prompt_ids: list[int], params: list[SamplingParams]
    ) -> list[Completion]:
        return await asyncio.gather(*(self.engine.generate(prompt_ids, p) for p in params))


def _given(value: _Setting | None, default: _Setting) -> _Setting:
    return default if value is None else value


def serve(engine: SamplingEngine, config: ServerConfig) -> None:
    import uvicorn

    uvicorn.run(create_app(engine, config), host=config.host, port=config.port)
