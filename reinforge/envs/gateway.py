"""An OpenAI-compatible endpoint for episodes: a third-party agent harness as the agent.

A harness (the OpenAI Agents SDK, any framework that speaks the chat completions API) only
sends text over HTTP and re-sends its whole conversation each call. The gateway gives each
episode its own base URL, `http://127.0.0.1:PORT/episodes/KEY/v1`, the key an unguessable
token: the URL is how a call is attributed to its rollout. It keeps the conversation as the
episode's `ChatClient` saw it, the policy's replies with the exact text it sampled, and
substitutes that for the prefix the harness re-sends, so the episode's token record stays
exactly what the engine sampled. The new messages after it (tool results) are cut at
`rollout.max_message_bytes`, as an environment's own are. A harness that changed an earlier
message gets a 400 and its rollout fails: its conversation can no longer be trained on
token-exactly.

One server serves every episode of the process, on a free port of 127.0.0.1, started in the
running event loop when the first episode opens.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI

from reinforge.envs.episode import Episode
from reinforge.policy.api_errors import APIError, bad_request, install_guards
from reinforge.policy.chat import parse_tool_calls
from reinforge.policy.choices import envelope, usage
from reinforge.policy.client import ChatClient, EpisodeLimit, EpisodeMisuse, Reply
from reinforge.policy.requests import (
    ChatRequest,
    chat_messages,
    checked_tools,
)
from reinforge.types import Message

MODEL = "policy"
"""The model the gateway lists; whatever name a harness asks for, the run's policy answers."""

MAX_REQUEST_BYTES = 64 * 2**20
"""A harness re-sends its whole conversation each call: tool output makes it long."""

IGNORED = ("temperature", "top_p", "seed", "user")
"""Fields a harness may send that change nothing: the run's sampling governs every turn."""

REFUSED = {
    "stream": "stream=true is not supported: the gateway answers each turn whole",
    "n": "n > 1 is not supported: an episode is one conversation",
    "stop": "stop is not supported: the policy's turn ends where it ends it",
    "logprobs": "logprobs are not returned: the gateway answers text only",
    "top_logprobs": "top_logprobs are not returned: the gateway answers text only",
    "prompt_logprobs": "prompt_logprobs are not returned: the gateway answers text only",
    "prompt_token_ids": "prompt_token_ids: the gateway keeps the episode's tokens itself",
    "stop_loops": "stop_loops: the run's sampling settings govern the episode",
}
"""Fields whose asking the gateway cannot honour, with why; each is refused naming it."""


@dataclass
class _Episode:
    """One open episode: its client, and its conversation as the harness was shown it and
    as the client was sent it (the same messages, the replies' text as sampled)."""

    client: ChatClient
    episode: Episode
    max_tokens: int
    shown: list[Message] = field(default_factory=list)
    sent: list[Message] = field(default_factory=list)
    failure: EpisodeMisuse | None = None
    """Why the episode cannot be trained on; its rollout fails with it."""
    out_of_tokens: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Gateway:
    """The process's one server, routing each call to the episode its URL names."""

    def __init__(self) -> None:
        self.episodes: dict[str, _Episode] = {}
        self.loop = asyncio.get_running_loop()
        self.app = _app(self)
        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        self.server = _Server(config)
        self._socket = listening
        self._serving = asyncio.create_task(self.server.serve(sockets=[listening]))

    async def started(self) -> None:
        while not self.server.started:
            if self._serving.done():
                self._serving.result()  # raises why it stopped
                raise RuntimeError("the episode gateway did not start")
            await asyncio.sleep(0.01)

    async def aclose(self) -> None:
        self.server.should_exit = True
        await self._serving
        self.close_socket()

    def close_socket(self) -> None:
        self._socket.close()

    async def chat(self, key: str, request: ChatRequest) -> dict[str, Any]:
        open_episode = self.episodes.get(key)
        if open_episode is None:
            raise APIError(404, f"no open episode at {key!r}", None, "not_found")
        _check(request)
        messages = chat_messages(request.messages)
        tools = checked_tools(request.tools) if request.offers_tools else None
        limit = request.max_completion_tokens or request.max_tokens or open_episode.max_tokens
        async with open_episode.lock:
            return await _turn(open_episode, request, messages, tools, limit)


class _Server(uvicorn.Server):
    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Signals stay the run's: Ctrl-C stops the run, not just the gateway."""
        yield


def _app(gateway: Gateway) -> FastAPI:
    app = FastAPI(title="reinforge episode gateway")
    install_guards(app, MAX_REQUEST_BYTES)

    @app.get("/episodes/{key}/v1/models")
    async def models(key: str) -> dict[str, Any]:
        if key not in gateway.episodes:
            raise APIError(404, f"no open episode at {key!r}", None, "not_found")
        card = {"id": MODEL, "object": "model", "created": 0, "owned_by": "reinforge"}
        return {"object": "list", "data": [card]}

    @app.post("/episodes/{key}/v1/chat/completions")
    async def chat(key: str, request: ChatRequest) -> dict[str, Any]:
        return await gateway.chat(key, request)

    return app


def _check(request: ChatRequest) -> None:
    request.check_supported()
    asked = {
        "stream": request.stream,
        "n": request.n > 1,
        "stop": bool(request.stop),
        "logprobs": request.logprobs,
        "top_logprobs": bool(request.top_logprobs),
        "prompt_logprobs": request.prompt_logprobs is not None,
        "prompt_token_ids": request.prompt_token_ids is not None,
        "stop_loops": request.stop_loops is not None,
    }
    for name, refused in REFUSED.items():
        if asked[name]:
            raise bad_request(refused, name)


async def _turn(
    open_episode: _Episode,
    request: ChatRequest,
    messages: list[Message],
    tools: list[dict[str, Any]] | None,
    max_tokens: int,
) -> dict[str, Any]:
    """One policy turn: the harness's new messages after the conversation as the client
    saw it."""
    if open_episode.failure is not None:
        raise bad_request(str(open_episode.failure), "messages")
    shown, episode = open_episode.shown, open_episode.episode
    changed = _first_change(messages, shown)
    if changed is not None:
        open_episode.failure = EpisodeMisuse(
            f"the harness rewrote the conversation (messages[{changed}] differs from what "
            "it was sent or answered): it cannot be trained on token-exactly"
        )
        raise bad_request(str(open_episode.failure), f"messages[{changed}]")
    conversation = [*open_episode.sent, *episode.within_limit(messages[len(shown) :])]
    try:
        reply = await open_episode.client.chat(
            conversation, tools, min(max_tokens, open_episode.max_tokens)
        )
    except EpisodeLimit as limit:
        open_episode.out_of_tokens = episode.truncated = True
        raise APIError(400, str(limit), "messages", "context_length_exceeded") from limit
    except EpisodeMisuse as misuse:
        open_episode.failure = misuse
        raise bad_request(str(misuse), "messages") from misuse
    answer = _answer(reply)
    open_episode.sent = [*conversation, reply.message]
    open_episode.shown = [*messages, answer]
    episode.messages = list(open_episode.sent)
    episode.turns += 1
    episode.tool_calls += len(reply.tool_calls)
    episode.truncated = reply.truncated
    finish = "length" if reply.truncated else reply.finish_reason
    choice = {"index": 0, "message": answer, "finish_reason": finish, "logprobs": None}
    return {
        **envelope("chat.completion", request.model),
        "choices": [choice],
        "usage": usage(reply.prompt_tokens, len(reply.token_ids)),
    }


def _answer(reply: Reply) -> Message:
    """The reply as OpenAI's API gives it: a call's markup parsed out of the text."""
    if not reply.tool_calls:
        return {"role": "assistant", "content": reply.text}
    content = parse_tool_calls(reply.text).content
    return {"role": "assistant", "content": content or None, "tool_calls": reply.tool_calls}


def _first_change(messages: list[Message], shown: list[Message]) -> int | None:
    """The index of the first message the harness changed or left out; None if it re-sent
    every one unchanged."""
    for index, message in enumerate(shown):
        if index >= len(messages) or _identity(messages[index]) != _identity(message):
            return index
    return None


def _identity(message: Message) -> tuple[Any, ...]:
    """What makes a message the same one, however a harness re-serialises it."""
    calls = tuple(
        (call.get("id"), call["function"]["name"], _arguments(call["function"].get("arguments")))
        for call in message.get("tool_calls") or []
    )
    content = message.get("content") or ""
    return message.get("role"), content, calls, message.get("tool_call_id")


def _arguments(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            return arguments
    return json.dumps(arguments, sort_keys=True)


_gateway: Gateway | None = None


async def _the_gateway() -> Gateway:
    global _gateway
    if _gateway is not None and _gateway.loop is not asyncio.get_running_loop():
        _gateway.close_socket()  # its loop has ended: it serves no more
        _gateway = None
    if _gateway is None:
        _gateway = Gateway()
    await _gateway.started()
    return _gateway


@asynccontextmanager
async def open_episode(client: ChatClient, episode: Episode, max_tokens: int) -> AsyncIterator[str]:
    """The episode's base URL (`.../v1`) while the block runs; its calls sample from
    `client`, at most `max_tokens` a turn. On leaving, a harness that rewrote its history
    fails the rollout (`EpisodeMisuse`), whatever the harness made of the 400 it got; and
    a harness that raised after the episode ran out of tokens ends it truncated."""
    gateway = await _the_gateway()
    key = secrets.token_urlsafe(24)
    opened = _Episode(client, episode, max_tokens)
    gateway.episodes[key] = opened
    try:
        yield f"{gateway.url}/episodes/{key}/v1"
    except Exception:
        if opened.failure is None and not opened.out_of_tokens:
            raise
    finally:
        del gateway.episodes[key]
    if opened.failure is not None:
        raise opened.failure


async def close_gateway() -> None:
    """Stop the server if no episode is open (an environment's `aclose`); the next episode
    starts another."""
    global _gateway
    if _gateway is None or _gateway.episodes:
        return
    gateway, _gateway = _gateway, None
    if gateway.loop is asyncio.get_running_loop():
        await gateway.aclose()
    else:
        gateway.close_socket()
