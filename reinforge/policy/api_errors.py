"""The policy server's errors as OpenAI's error JSON, the field at fault named, and the
guard around every route: a request body past its limit refused before it is parsed, and
no traceback or FastAPI `{"detail": ...}` ever answered."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as ASGIMessage

log = logging.getLogger(__name__)


class APIError(Exception):
    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def bad_request(message: str, param: str | None) -> APIError:
    return APIError(400, message, param, "invalid_request")


def install_guards(app: FastAPI, max_request_bytes: int) -> None:
    """Every error answers OpenAI's error JSON, the field at fault named, never a traceback
    or FastAPI's own `{"detail": ...}` (an unknown route, a wrong method); and a request
    body past `max_request_bytes` is refused before it is parsed."""
    app.exception_handler(APIError)(_api_error)
    app.exception_handler(RequestValidationError)(_invalid)
    app.exception_handler(HTTPException)(_http_error)
    app.add_middleware(RequestGuard, max_bytes=max_request_bytes)


class RequestGuard:
    """ASGI middleware around every route. A body past `max_bytes` is a 413 before any of
    it is parsed: at once when its Content-Length says so, else as soon as the bytes read
    pass it; parsing and tokenising many megabytes would keep the server busy for seconds.
    An exception nothing else handled is a 500 in OpenAI's shape, and goes no further:
    past here Starlette would send its answer and raise on, and the server would then close
    the connection (an in-process client would get the exception itself)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            message = f"{scope['method']} {scope['path']}: {self._too_large()}"
            await _error(413, message, None, _code(413))(scope, receive, send)
            return
        received = 0
        started = False

        async def limited() -> ASGIMessage:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise HTTPException(413, self._too_large())
            return message

        async def tracked(message: ASGIMessage) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, tracked)
        except Exception as error:
            if started:  # a stream broke off: there is no answer left to give
                raise
            log.exception("internal error")
            message = f"internal error: {type(error).__name__}: {error}"
            await _error(500, message, None, None)(scope, receive, send)

    def _too_large(self) -> str:
        return (
            f"the request body is larger than this server takes: at most {self.max_bytes} "
            "bytes (server.max_request_bytes)"
        )


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


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
    if first.get("type") == "extra_forbidden":
        message = f"{param} is not a field this server takes (it refuses what it would ignore)"
        return _error(400, message, param, "invalid_request")
    return _error(400, f"{param}: {first.get('msg')}", param, "invalid_request")


def _param(loc: tuple[Any, ...]) -> str | None:
    """A field's path as OpenAI writes it: `messages[0].content`."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path or None


async def _http_error(request: Request, error: HTTPException) -> JSONResponse:
    """What Starlette itself refuses (no such route, a method the route does not take), and
    a body past the limit."""
    message = f"{request.method} {request.url.path}: {error.detail}"
    response = _error(error.status_code, message, None, _code(error.status_code))
    response.headers.update(error.headers or {})  # a 405's Allow
    return response


def _code(status: int) -> str:
    """The status's name as an error code: `not_found`, `method_not_allowed`,
    `request_entity_too_large`."""
    return HTTPStatus(status).phrase.lower().replace(" ", "_")


def _error(status: int, message: str, param: str | None, code: str | None) -> JSONResponse:
    return JSONResponse(status_code=status, content=error_body(status, message, param, code))
