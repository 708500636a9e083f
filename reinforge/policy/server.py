"""OpenAI-compatible HTTP server over an Engine, with token-in/token-out extensions.

Extensions to OpenAI's schema (ignored by clients that do not know them):
- response `prompt_token_ids` and `policy_version`; each choice's `token_ids`,
  `policy_versions` (one per token) and `raw_text` (the completion as sampled, tool-call
  markup included, final EOS excluded);
- request `prompt_token_ids`: the exact tokens of the conversation so far, through the
  last assistant turn's sampled tokens. The server appends the template's tokens for the
  messages after the last assistant message, so earlier turns are never re-rendered.
  With no assistant message in `messages`, `prompt_token_ids` is the whole prompt.

Bad requests get OpenAI's error JSON with a 4xx status; never a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from reinforge.policy.chat import ChatFormat, TemplateError, parse_tool_calls
from reinforge.policy.engine import Completion, Engine
from reinforge.policy.sampling import SamplingParams

log = logging.getLogger(__name__)


class APIError(Exception):
    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


class _Sampling(BaseModel):
    """Fields shared by both endpoints. Unknown OpenAI fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
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


class CompletionRequest(_Sampling):
    prompt: str | list[int] = ""
    logprobs: int | None = Field(None, ge=0, le=0)


def create_app(engine: Engine, default_max_tokens: int = 512) -> FastAPI:
    """The FastAPI app; also mounted in-process (httpx ASGI transport) by PolicyClient."""
    app = FastAPI(title="reinforge policy server")
    chat_format = ChatFormat(engine.tokenizer)
    tokenizer = engine.tokenizer

    @app.exception_handler(APIError)
    async def _api_error(_: Request, error: APIError) -> JSONResponse:
        return _error(error.status, error.message, error.param, error.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        if param is None:  # the body itself: not JSON, or not an object
            message = "the request body must be a JSON object (Content-Type: application/json)"
            return _error(400, message, None, "invalid_request")
        return _error(400, f"{param}: {first.get('msg')}", param, "invalid_request")

    @app.exception_handler(Exception)
    async def _internal(_: Request, error: Exception) -> JSONResponse:
        log.exception("internal error")
        return _error(500, f"internal error: {type(error).__name__}: {error}", None, None)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": engine.name, "policy_version": engine.version}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": engine.name,
            "object": "model",
            "created": 0,
            "owned_by": "reinforge",
            "max_model_len": engine.max_context,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat(request: ChatRequest) -> dict[str, Any]:
        _check_common(request)
        prompt_ids = _chat_prompt(request)
        completions = await _generate(request, prompt_ids)
        choices = [_chat_choice(i, c, request) for i, c in enumerate(completions)]
        return _response("chat.completion", request, prompt_ids, completions, choices)

    @app.post("/v1/completions")
    async def complete(request: CompletionRequest) -> dict[str, Any]:
        _check_common(request)
        if request.prompt_token_ids is not None:
            prompt_ids = request.prompt_token_ids
        elif isinstance(request.prompt, list):
            prompt_ids = request.prompt
        else:
            prompt_ids = tokenizer.encode(request.prompt, add_special_tokens=False)
        completions = await _generate(request, prompt_ids)
        choices = [_text_choice(i, c, request) for i, c in enumerate(completions)]
        return _response("text_completion", request, prompt_ids, completions, choices)

    def _check_common(request: _Sampling) -> None:
        if request.model != engine.name:
            raise APIError(
                404,
                f"The model '{request.model}' does not exist; this server serves '{engine.name}'.",
                "model",
                "model_not_found",
            )
        if request.stream:
            raise APIError(400, "stream=true is not supported", "stream", "invalid_request")

    def _chat_prompt(request: ChatRequest) -> list[int]:
        messages = request.messages
        if request.prompt_token_ids is None and not messages:
            raise APIError(400, "messages must not be empty", "messages", "invalid_request")
        for index, message in enumerate(messages):
            if not isinstance(message.get("role"), str):
                raise APIError(400, f"messages[{index}] has no role", "messages", "invalid_request")
        try:
            if request.prompt_token_ids is None:
                return chat_format.prompt_ids(messages, request.tools)
            last = max(
                (i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None
            )
            if last is None:
                return request.prompt_token_ids
            previous = request.prompt_token_ids
            ended_with_eos = bool(previous) and previous[-1] in engine.eos_ids
            return chat_format.continuation_ids(previous, messages[last + 1 :], ended_with_eos)
        except TemplateError as error:
            raise APIError(400, str(error), "messages", "invalid_request") from error

    async def _generate(request: _Sampling, prompt_ids: list[int]) -> list[Completion]:
        if not prompt_ids:
            raise APIError(400, "the prompt is empty", "prompt", "invalid_request")
        if any(not 0 <= t < len(tokenizer) for t in prompt_ids):
            raise APIError(
                400,
                "prompt_token_ids holds ids outside the vocabulary",
                "prompt_token_ids",
                "invalid_request",
            )
        room = engine.max_context - len(prompt_ids)
        max_tokens = request.max_completion_tokens or request.max_tokens
        if room < 1 or (max_tokens is not None and max_tokens > room):
            raise APIError(
                400,
                f"This model's maximum context length is {engine.max_context} tokens; the "
                f"prompt has {len(prompt_ids)} and max_tokens asks for {max_tokens}.",
                "messages",
                "context_length_exceeded",
            )
        params = [
            SamplingParams(
                max_tokens=max_tokens or min(default_max_tokens, room),
                temperature=request.temperature,
                top_p=request.top_p,
                stop=tuple(request.stop or ()),
                seed=None if request.seed is None else request.seed + i,
            )
            for i in range(request.n)
        ]
        return await asyncio.gather(*(engine.generate(prompt_ids, p) for p in params))

    def _text(completion: Completion) -> str:
        ids = completion.token_ids
        if completion.finish_reason == "stop" and ids and ids[-1] in engine.eos_ids:
            ids = ids[:-1]
        text = tokenizer.decode(ids)
        if completion.stop_text is not None:
            text = text[: text.find(completion.stop_text)]
        return text

    def _token_logprobs(completion: Completion) -> list[dict[str, Any]]:
        tokens = [tokenizer.decode([t]) for t in completion.token_ids]
        return [
            {"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []}
            for tok, lp in zip(tokens, completion.logprobs, strict=True)
        ]

    def _extensions(completion: Completion) -> dict[str, Any]:
        return {
            "token_ids": completion.token_ids,
            "policy_versions": completion.policy_versions,
            "raw_text": _text(completion),
        }

    def _chat_choice(index: int, completion: Completion, request: ChatRequest) -> dict[str, Any]:
        text = _text(completion)
        message: dict[str, Any] = {"role": "assistant", "content": text}
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
        logprobs = {"content": _token_logprobs(completion)} if request.logprobs else None
        return {
            "index": index,
            "message": message,
            "finish_reason": finish,
            "logprobs": logprobs,
            **_extensions(completion),
        }

    def _text_choice(
        index: int, completion: Completion, request: CompletionRequest
    ) -> dict[str, Any]:
        logprobs = None
        if request.logprobs is not None:
            entries = _token_logprobs(completion)
            logprobs = {
                "tokens": [e["token"] for e in entries],
                "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": None,
                "text_offset": None,
            }
        return {
            "index": index,
            "text": _text(completion),
            "finish_reason": completion.finish_reason,
            "logprobs": logprobs,
            **_extensions(completion),
        }

    def _response(
        kind: Literal["chat.completion", "text_completion"],
        request: _Sampling,
        prompt_ids: list[int],
        completions: list[Completion],
        choices: list[dict[str, Any]],
    ) -> dict[str, Any]:
        generated = sum(len(c.token_ids) for c in completions)
        prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": engine.name,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": generated,
                "total_tokens": len(prompt_ids) + generated,
            },
            "prompt_token_ids": prompt_ids,
            "policy_version": engine.version,
        }

    return app


def _error(status: int, message: str, param: str | None, code: str | None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(status_code=status, content=body)


def serve(engine: Engine, host: str, port: int, log_level: str = "info") -> None:
    import uvicorn

    uvicorn.run(create_app(engine), host=host, port=port, log_level=log_level)
