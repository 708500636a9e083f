"""OpenAI-compatible HTTP server over an Engine, with token-in/token-out extensions.

Extensions to OpenAI's schema (ignored by clients that do not know them):
- response `prompt_token_ids` and `policy_version`; each choice's `token_ids`,
  `policy_versions` (one per token) and `raw_text` (the completion as sampled, tool-call
  markup included, final EOS excluded). A stream carries them in each choice's last chunk;
- request `prompt_token_ids`: the exact tokens of the conversation so far, through the
  last assistant turn's sampled tokens. The server appends the template's tokens for the
  messages after the last assistant message, so earlier turns are never re-rendered.
  With no assistant message in `messages`, `prompt_token_ids` is the whole prompt;
- `POST /v1/weights` `{"path", "version"}`: a trainer on this machine hands over new
  weights as a safetensors file, with `server.weights_token` as its bearer token; they
  apply between two decode steps and requests in flight continue under them.

Bad requests get OpenAI's error JSON with a 4xx status naming the field at fault; never a
traceback. docs/server.md describes the API.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from safetensors import SafetensorError
from safetensors.torch import load_file

from reinforge.policy.backends import SamplingEngine
from reinforge.policy.chat import ChatFormat, TemplateError, parse_tool_calls
from reinforge.policy.config import ServerConfig
from reinforge.policy.engine import Completion
from reinforge.policy.requests import (
    APIError,
    ChatRequest,
    CompletionRequest,
    SamplingRequest,
    WeightsUpdate,
    bad_request,
    chat_messages,
    checked_tools,
)
from reinforge.policy.sampling import SamplingParams

log = logging.getLogger(__name__)
_Json = dict[str, Any]  # a JSON object, as the OpenAI schema shapes it


def create_app(engine: SamplingEngine, config: ServerConfig) -> FastAPI:
    """The FastAPI app; also mounted in-process (httpx ASGI transport) by PolicyClient."""
    app = FastAPI(title="reinforge policy server")
    service = _Service(engine, config)
    app.exception_handler(APIError)(_api_error)
    app.exception_handler(RequestValidationError)(_invalid)
    app.exception_handler(Exception)(_internal)

    @app.get("/health")
    async def health() -> _Json:
        return {"status": "ok", "model": engine.name, "policy_version": engine.version}

    @app.get("/v1/models")
    async def models() -> _Json:
        card = {
            "id": engine.name,
            "object": "model",
            "created": 0,
            "owned_by": "reinforge",
            "max_model_len": engine.max_context,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: ChatRequest) -> _Json | StreamingResponse:
        service.check(request)
        prompt_ids = service.chat_prompt(request)
        params = service.sampling(request, prompt_ids)
        if request.stream:
            return service.stream("chat.completion.chunk", request, prompt_ids, params)
        completions = await service.generate(prompt_ids, params)
        choices = [service.chat_choice(i, c, request) for i, c in enumerate(completions)]
        return service.response("chat.completion", prompt_ids, completions, choices)

    @app.post("/v1/completions", response_model=None)
    async def complete(request: CompletionRequest) -> _Json | StreamingResponse:
        service.check(request)
        prompt_ids = service.completion_prompt(request)
        params = service.sampling(request, prompt_ids)
        if request.stream:
            return service.stream("text_completion", request, prompt_ids, params)
        completions = await service.generate(prompt_ids, params)
        choices = [service.text_choice(i, c, request) for i, c in enumerate(completions)]
        return service.response("text_completion", prompt_ids, completions, choices)

    @app.post("/v1/weights")
    async def weights(update: WeightsUpdate, request: Request) -> _Json:
        service.authorize_weights(request)
        version = await asyncio.to_thread(service.load_weights, update)
        return {"policy_version": version}

    return app


@dataclass(frozen=True)
class _Piece:
    """A stretch of a completion's text and the sampled tokens (by index) that wrote it."""

    text: str
    tokens: list[int]


class _Service:
    """The engine-bound work behind the completion routes, kept out of `create_app` so the
    app reads as wiring. Requests left without sampling settings take `config`'s."""

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
        try:
            state = load_file(update.path)
        except (OSError, SafetensorError) as error:
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
        # The engine returns the log-prob of the sampled token only, not its distribution.
        alternatives, param = (
            (request.top_logprobs, "top_logprobs")
            if isinstance(request, ChatRequest)
            else (request.logprobs, "logprobs")
        )
        if alternatives:
            raise bad_request(
                f"{param}={alternatives} is not supported: this server returns the log-prob "
                f"of each sampled token only, without alternatives; send {param}=0 or leave "
                "it out",
                param,
            )

    def chat_prompt(self, request: ChatRequest) -> list[int]:
        messages, previous = chat_messages(request.messages), request.prompt_token_ids
        tools = checked_tools(request.tools)
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

    def sampling(self, request: SamplingRequest, prompt_ids: list[int]) -> list[SamplingParams]:
        """One setting per choice, checked against the prompt before anything is sampled
        (so that a stream never starts for a request that cannot be served)."""
        if not prompt_ids:
            raise bad_request("the prompt is empty", "prompt")
        if any(not 0 <= t < len(self.tokenizer) for t in prompt_ids):
            raise bad_request(
                "prompt_token_ids holds ids outside the vocabulary", "prompt_token_ids"
            )
        room = self.engine.max_context - len(prompt_ids)
        max_tokens = request.max_completion_tokens or request.max_tokens
        if room < 1 or (max_tokens is not None and max_tokens > room):
            raise APIError(
                400,
                f"This model's maximum context length is {self.engine.max_context} tokens; the "
                f"prompt has {len(prompt_ids)} and max_tokens asks for {max_tokens}.",
                "messages",
                "context_length_exceeded",
            )
        return [
            SamplingParams(
                max_tokens=max_tokens or min(self.config.max_tokens, room),
                temperature=_given(request.temperature, self.config.sampling.temperature),
                top_p=_given(request.top_p, self.config.sampling.top_p),
                stop=tuple(request.stop or ()),
                seed=None if request.seed is None else request.seed + i,
            )
            for i in range(request.n)
        ]

    async def generate(
        self, prompt_ids: list[int], params: list[SamplingParams]
    ) -> list[Completion]:
        return await asyncio.gather(*(self.engine.generate(prompt_ids, p) for p in params))

    async def _as_finished(
        self, prompt_ids: list[int], params: list[SamplingParams]
    ) -> AsyncIterator[tuple[int, Completion]]:
        """(choice index, completion) as each finishes, so a short choice streams before a
        long one is done."""
        tasks = [asyncio.ensure_future(self.engine.generate(prompt_ids, p)) for p in params]
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=tasks.index):
                    yield tasks.index(task), task.result()
        finally:  # the client went away, or a choice failed
            for task in pending:
                task.cancel()

    def stream(
        self,
        kind: Literal["chat.completion.chunk", "text_completion"],
        request: ChatRequest | CompletionRequest,
        prompt_ids: list[int],
        params: list[SamplingParams],
    ) -> StreamingResponse:
        """Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`.

        The engine hands over a completion only when it has finished (it has no
        per-token callback), so each choice streams, in chunks of about one token, once it
        is done; choices stream in the order they finish. A stream therefore saves a client
        no waiting, only its own code path. A choice's last chunk carries its
        `finish_reason` and the token-id extensions. A client that goes away stops the
        stream, not the sampling already under way.
        """
        prefix = "chatcmpl" if kind == "chat.completion.chunk" else "cmpl"
        envelope = {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.engine.name,
        }

        async def events() -> AsyncIterator[str]:
            generated = 0
            try:
                async for index, completion in self._as_finished(prompt_ids, params):
                    generated += len(completion.token_ids)
                    for choice in self._choice_chunks(index, completion, request):
                        yield _sse(self._chunk(envelope, choice, prompt_ids, request))
            except Exception as error:  # headers are sent: the error travels as an event
                log.exception("stream failed")
                yield _sse(_error_body(500, f"internal error: {type(error).__name__}: {error}"))
                return
            if request.include_usage:
                usage = _usage(len(prompt_ids), generated)
                yield _sse({**envelope, "choices": [], "usage": usage})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    def _chunk(
        self,
        envelope: _Json,
        choice: _Json,
        prompt_ids: list[int],
        request: ChatRequest | CompletionRequest,
    ) -> _Json:
        chunk = {**envelope, "choices": [choice]}
        if request.include_usage:
            chunk["usage"] = None
        if choice["finish_reason"] is not None:
            chunk.update(prompt_token_ids=prompt_ids, policy_version=self.engine.version)
        return chunk

    def _choice_chunks(
        self, index: int, completion: Completion, request: ChatRequest | CompletionRequest
    ) -> Iterator[_Json]:
        if isinstance(request, ChatRequest):
            return self._chat_chunks(index, completion, request)
        return self._text_chunks(index, completion, request)

    def _chat_chunks(
        self, index: int, completion: Completion, request: ChatRequest
    ) -> Iterator[_Json]:
        """The choice as deltas. Parsed tool calls come whole in one delta (with the
        choice's log-probs): they are known only once the text is complete."""
        choice = self.chat_choice(index, completion, request)
        message = choice["message"]
        entries = self._token_logprobs(completion) if request.logprobs else []
        yield _delta(index, {"role": "assistant", "content": ""})
        if "tool_calls" in message:
            delta: _Json = {"content": message["content"]} if message["content"] else {}
            calls = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
            yield _delta(index, {**delta, "tool_calls": calls}, entries, request.logprobs)
        else:
            for piece in self._pieces(completion, message["content"]):
                if piece.text or request.logprobs:
                    listed = [entries[t] for t in piece.tokens] if entries else []
                    yield _delta(index, {"content": piece.text}, listed, request.logprobs)
        extensions = {k: v for k, v in choice.items() if k not in ("message", "logprobs")}
        yield {**_delta(index, {}), **extensions}

    def _text_chunks(
        self, index: int, completion: Completion, request: CompletionRequest
    ) -> Iterator[_Json]:
        choice = self.text_choice(index, completion, request)
        logprobs = choice["logprobs"]
        for piece in self._pieces(completion, choice["text"]):
            if not (piece.text or logprobs):
                continue
            part = None
            if logprobs is not None:
                part = {
                    key: [logprobs[key][t] for t in piece.tokens]
                    for key in ("tokens", "token_logprobs")
                } | {"top_logprobs": None, "text_offset": None}
            yield {"index": index, "text": piece.text, "logprobs": part, "finish_reason": None}
        yield {**choice, "text": "", "logprobs": None}

    def _pieces(self, completion: Completion, text: str) -> list[_Piece]:
        """`text` cut where the sampled tokens end, so that the pieces join to exactly the
        text the non-streamed response holds (EOS left out, cut at a stop string). A token
        that adds no text (the bytes of a character still to come, EOS) joins the next
        piece, or a last piece of no text, so every token's log-prob has a chunk.

        Tokens are decoded in a window that starts one decoded step back, as vLLM does:
        a tokenizer may write a token differently at the start of a sequence (a dropped
        leading space), and decoding from the start each time would cost O(n^2)."""
        pieces: list[_Piece] = []
        pending: list[int] = []
        emitted = context = read = 0  # ids[context:read] were decoded: context for the next
        ids = completion.token_ids
        for k in range(len(ids)):
            pending.append(k)
            before = self.tokenizer.decode(ids[context:read])
            after = self.tokenizer.decode(ids[context : k + 1])
            if after.endswith("\ufffd") or len(after) <= len(before):
                continue
            context, read = read, k + 1
            reach = min(emitted + len(after) - len(before), len(text))
            if reach > emitted:
                pieces.append(_Piece(text[emitted:reach], pending))
                pending, emitted = [], reach
        if emitted < len(text) or pending:
            pieces.append(_Piece(text[emitted:], pending))
        return pieces

    def _text(self, completion: Completion) -> str:
        ids = completion.token_ids
        if completion.finish_reason == "stop" and ids and ids[-1] in self.engine.eos_ids:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids)
        if completion.stop_text is not None:
            text = text[: text.find(completion.stop_text)]
        return text

    def _token_logprobs(self, completion: Completion) -> list[_Json]:
        tokens = [self.tokenizer.decode([t]) for t in completion.token_ids]
        return [
            {"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []}
            for tok, lp in zip(tokens, completion.logprobs, strict=True)
        ]

    def chat_choice(self, index: int, completion: Completion, request: ChatRequest) -> _Json:
        text = self._text(completion)
        message: _Json = {"role": "assistant", "content": text}
        finish: str = completion.finish_reason
        if request.tools:
            parsed = parse_tool_calls(text)
            if parsed.tool_calls:
                message = {
                    "role": "assistant",
                    "content": parsed.content or None,
                    "tool_calls": parsed.tool_calls,
                }
                finish = "tool_calls" if finish == "stop" else finish
        logprobs = {"content": self._token_logprobs(completion)} if request.logprobs else None
        return {
            "index": index,
            "message": message,
            "finish_reason": finish,
            "logprobs": logprobs,
            **_extensions(completion, text),
        }

    def text_choice(self, index: int, completion: Completion, request: CompletionRequest) -> _Json:
        logprobs = None
        if request.logprobs is not None:
            entries = self._token_logprobs(completion)
            logprobs = {
                "tokens": [e["token"] for e in entries],
                "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": None,
                "text_offset": None,
            }
        text = self._text(completion)
        return {
            "index": index,
            "text": text,
            "finish_reason": completion.finish_reason,
            "logprobs": logprobs,
            **_extensions(completion, text),
        }

    def response(
        self,
        kind: Literal["chat.completion", "text_completion"],
        prompt_ids: list[int],
        completions: list[Completion],
        choices: list[_Json],
    ) -> _Json:
        generated = sum(len(c.token_ids) for c in completions)
        prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.engine.name,
            "choices": choices,
            "usage": _usage(len(prompt_ids), generated),
            "prompt_token_ids": prompt_ids,
            "policy_version": self.engine.version,
        }


def _delta(
    index: int, delta: _Json, entries: list[_Json] | None = None, logprobs: bool = False
) -> _Json:
    return {
        "index": index,
        "delta": delta,
        "logprobs": {"content": entries or []} if logprobs else None,
        "finish_reason": None,
    }


def _extensions(completion: Completion, text: str) -> _Json:
    return {
        "token_ids": completion.token_ids,
        "policy_versions": completion.policy_versions,
        "raw_text": text,
    }


def _usage(prompt_tokens: int, generated: int) -> _Json:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": prompt_tokens + generated,
    }


def _sse(data: _Json) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


async def _api_error(_: Request, error: APIError) -> JSONResponse:
    return _error(error.status, error.message, error.param, error.code)


async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
    first = error.errors()[0]
    loc = tuple(first.get("loc", ()))[1:]
    if first.get("type") == "json_invalid":  # loc holds the character offset, not a field
        reason = (first.get("ctx") or {}).get("error", "decode error")
        at = f" at character {loc[0]}" if loc else ""
        return _error(400, f"request body is not valid JSON: {reason}{at}", None, "invalid_request")
    param = _param(loc)
    if param is None:  # the body itself is not an object
        message = "the request body must be a JSON object (Content-Type: application/json)"
        return _error(400, message, None, "invalid_request")
    return _error(400, f"{param}: {first.get('msg')}", param, "invalid_request")


def _param(loc: tuple[Any, ...]) -> str | None:
    """A field's path as OpenAI writes it: `messages[0].content`."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path or None


async def _internal(_: Request, error: Exception) -> JSONResponse:
    log.exception("internal error")
    return _error(500, f"internal error: {type(error).__name__}: {error}", None, None)


def _error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> _Json:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _error(status: int, message: str, param: str | None, code: str | None) -> JSONResponse:
    return JSONResponse(status_code=status, content=_error_body(status, message, param, code))


def serve(engine: SamplingEngine, config: ServerConfig) -> None:
    import uvicorn

    uvicorn.run(create_app(engine, config), host=config.host, port=config.port)
