"""OpenAI-compatible HTTP server over an Engine, with token-in/token-out extensions.

Extensions to OpenAI's schema (ignored by clients that do not know them):
- response `prompt_token_ids` and `policy_version`; each choice's `token_ids`,
  `policy_versions` (one per token) and `raw_text` (the completion as sampled, tool-call
  markup included, final EOS excluded);
- request `prompt_token_ids`: the exact tokens of the conversation so far, through the
  last assistant turn's sampled tokens. The server appends the template's tokens for the
  messages after the last assistant message, so earlier turns are never re-rendered.
  With no assistant message in `messages`, `prompt_token_ids` is the whole prompt;
- `POST /v1/weights` `{"path", "version"}`: a trainer on this machine hands over new
  weights as a safetensors file, with `server.weights_token` as its bearer token; they
  apply between two decode steps and requests in flight continue under them.

Bad requests get OpenAI's error JSON with a 4xx status; never a traceback.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator
from safetensors import SafetensorError
from safetensors.torch import load_file

from reinforge.policy.chat import ChatFormat, TemplateError, parse_tool_calls
from reinforge.policy.config import ServerConfig, Temperature, TopP
from reinforge.policy.engine import Completion, Engine
from reinforge.policy.sampling import SamplingParams

log = logging.getLogger(__name__)
_Json = dict[str, Any]  # a JSON object, as the OpenAI schema shapes it


class APIError(Exception):
    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


class _Sampling(BaseModel):
    """Fields shared by both endpoints. Unknown OpenAI fields are accepted and ignored.
    A setting left out takes the server's configured default (`ServerConfig`)."""

    model_config = ConfigDict(extra="allow")

    model: str
    temperature: Temperature | None = None
    top_p: TopP | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=64)
    seed: int | None = None
    stream: bool = False
    prompt_token_ids: list[int] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str] | None:
        if isinstance(value, str):
            value = [value]
        if value is not None and (len(value) > 4 or not all(value)):
            raise ValueError("stop takes at most 4 non-empty strings")
        return value


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=0)


class WeightsUpdate(BaseModel):
    """A trainer's new weights, handed over as a file on this machine (in memory under
    /dev/shm where there is one): no tensor data crosses HTTP."""

    model_config = ConfigDict(extra="forbid")

    path: str
    """A safetensors file of the model's parameters, under their plain names."""
    version: int = Field(ge=0)
    """The policy version the trainer gives these weights; tokens sampled after the update
    carry it."""


class CompletionRequest(_Sampling):
    prompt: str | list[int] = ""
    logprobs: int | None = Field(None, ge=0, le=0)


def create_app(engine: Engine, config: ServerConfig) -> FastAPI:
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

    @app.post("/v1/chat/completions")
    async def chat(request: ChatRequest) -> _Json:
        service.check(request)
        prompt_ids = service.chat_prompt(request)
        completions = await service.generate(request, prompt_ids)
        choices = [service.chat_choice(i, c, request) for i, c in enumerate(completions)]
        return service.response("chat.completion", prompt_ids, completions, choices)

    @app.post("/v1/completions")
    async def complete(request: CompletionRequest) -> _Json:
        service.check(request)
        prompt_ids = service.completion_prompt(request)
        completions = await service.generate(request, prompt_ids)
        choices = [service.text_choice(i, c, request) for i, c in enumerate(completions)]
        return service.response("text_completion", prompt_ids, completions, choices)

    @app.post("/v1/weights")
    async def weights(update: WeightsUpdate, request: Request) -> _Json:
        service.authorize_weights(request)
        version = await asyncio.to_thread(service.load_weights, update)
        return {"policy_version": version}

    return app


class _Service:
    """The engine-bound work behind the completion routes, kept out of `create_app` so the
    app reads as wiring. Requests left without sampling settings take `config`'s."""

    def __init__(self, engine: Engine, config: ServerConfig) -> None:
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

    def check(self, request: _Sampling) -> None:
        name = self.engine.name
        if request.model != name:
            raise APIError(
                404,
                f"The model '{request.model}' does not exist; this server serves '{name}'.",
                "model",
                "model_not_found",
            )
        if request.stream:
            raise APIError(400, "stream=true is not supported", "stream", "invalid_request")

    def chat_prompt(self, request: ChatRequest) -> list[int]:
        messages, previous = request.messages, request.prompt_token_ids
        if previous is None and not messages:
            raise APIError(400, "messages must not be empty", "messages", "invalid_request")
        for index, message in enumerate(messages):
            if not isinstance(message.get("role"), str):
                raise APIError(400, f"messages[{index}] has no role", "messages", "invalid_request")
        try:
            if previous is None:
                return self.chat_format.prompt_ids(messages, request.tools)
            last = max(
                (i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None
            )
            if last is None:
                return previous
            ended_with_eos = bool(previous) and previous[-1] in self.engine.eos_ids
            return self.chat_format.continuation_ids(previous, messages[last + 1 :], ended_with_eos)
        except TemplateError as error:
            raise APIError(400, str(error), "messages", "invalid_request") from error

    def completion_prompt(self, request: CompletionRequest) -> list[int]:
        if request.prompt_token_ids is not None:
            return request.prompt_token_ids
        if isinstance(request.prompt, list):
            return request.prompt
        return self.tokenizer.encode(request.prompt, add_special_tokens=False)

    async def generate(self, request: _Sampling, prompt_ids: list[int]) -> list[Completion]:
        if not prompt_ids:
            raise APIError(400, "the prompt is empty", "prompt", "invalid_request")
        if any(not 0 <= t < len(self.tokenizer) for t in prompt_ids):
            raise APIError(
                400,
                "prompt_token_ids holds ids outside the vocabulary",
                "prompt_token_ids",
                "invalid_request",
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
        params = [
            SamplingParams(
                max_tokens=max_tokens or min(self.config.max_tokens, room),
                temperature=_given(request.temperature, self.config.sampling.temperature),
                top_p=_given(request.top_p, self.config.sampling.top_p),
                stop=tuple(request.stop or ()),
                seed=None if request.seed is None else request.seed + i,
            )
            for i in range(request.n)
        ]
        return await asyncio.gather(*(self.engine.generate(prompt_ids, p) for p in params))

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
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": generated,
                "total_tokens": len(prompt_ids) + generated,
            },
            "prompt_token_ids": prompt_ids,
            "policy_version": self.engine.version,
        }


def _extensions(completion: Completion, text: str) -> _Json:
    return {
        "token_ids": completion.token_ids,
        "policy_versions": completion.policy_versions,
        "raw_text": text,
    }


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


async def _api_error(_: Request, error: APIError) -> JSONResponse:
    return _error(error.status, error.message, error.param, error.code)


async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
    first = error.errors()[0]
    param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    if param is None:  # the body itself: not JSON, or not an object
        message = "the request body must be a JSON object (Content-Type: application/json)"
        return _error(400, message, None, "invalid_request")
    return _error(400, f"{param}: {first.get('msg')}", param, "invalid_request")


async def _internal(_: Request, error: Exception) -> JSONResponse:
    log.exception("internal error")
    return _error(500, f"internal error: {type(error).__name__}: {error}", None, None)


def _error(status: int, message: str, param: str | None, code: str | None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(status_code=status, content=body)


def serve(engine: Engine, config: ServerConfig) -> None:
    import uvicorn

    uvicorn.run(create_app(engine, config), host=config.host, port=config.port)
