"""The record of one rollout as the environment sees it: the rubric's input."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from reinforge.policy.chat import CHAT_API_FORMAT, ToolFormat, with_tool_prompt
from reinforge.types import Message, Task

if TYPE_CHECKING:
    from reinforge.envs.tools import Tool


@dataclass
class EpisodeClock:
    """Where the environment's time went in one episode; the rollout's timings report it."""

    start_s: float = 0.0
    stop_s: float = 0.0
    turns_s: list[float] = field(default_factory=list)
    """Each turn's answer: its tool calls, or the environment's response to it."""

    @contextmanager
    def timing(self, part: Literal["start_s", "stop_s"]) -> Iterator[None]:
        """Time the body as `part`, however it ends."""
        started = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, part, time.perf_counter() - started)


@dataclass
class Episode:
    """One rollout as the environment saw it; the rubric's input."""

    task: Task
    messages: list[Message]
    state: dict[str, Any] = field(default_factory=dict)
    """The environment's own per-episode data (a board, guesses); kept as trajectory info."""
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    truncated: bool = False
    tools: list[Tool] | None = None
    """The tools as this episode was shown them, where they are not the harness's (a recipe
    renamed, redescribed or reordered them; a sub-agent's nested episode has all but the
    sub-agent); None: the harness's."""
    tool_format: ToolFormat = CHAT_API_FORMAT
    """How the model was asked to write tool calls. Hermes is the chat API's: the tools go
    with each request, and the server tells them to the model and parses its calls; any
    other format is told in the system prompt (`offer_tools`) and read from the text."""
    sampled_token_ids: list[list[int]] = field(default_factory=list, repr=False)
    """The token ids the policy sampled, one list per turn, filled in by the rollout
    generator when the episode ends: what graders of length and repetition count."""
    resources: dict[str, Any] = field(default_factory=dict, repr=False)
    """Live per-episode objects (a sandbox); never serialised, released by `stop`."""
    max_message_bytes: int | None = None
    """The most bytes of text that one message `add` appends may hold; the rollout
    generator sets it from `rollout.max_message_bytes`. None: no limit."""
    extras: dict[type[Any], Any] = field(default_factory=dict, repr=False)
    """Typed records that a recipe or the environment keeps on the episode for itself (the
    reasoning level a rollout drew, a Harbor grading), each under its type, which only
    its owner reads; never serialised: what users see goes into `state`, or into the
    trajectory's info."""
    clock: EpisodeClock = field(default_factory=EpisodeClock, repr=False)

    def add(self, messages: list[Message]) -> None:
        """Append messages from outside the policy (tool results, the environment's
        answers), each cut to `max_message_bytes` with a note saying so: a tool that
        prints 100 MB would otherwise send it all to the policy server on the next turn,
        and into the trajectory."""
        self.messages.extend(self.within_limit(messages))

    def within_limit(self, messages: list[Message]) -> list[Message]:
        """`messages` each cut to `max_message_bytes`, with a note saying so."""
        limit = self.max_message_bytes
        return messages if limit is None else [_cut(m, limit) for m in messages]

    def offer_tools(self, tools: list[Tool], tool_format: ToolFormat) -> None:
        """Offer `tools`, to be called in `tool_format`: the chat API's go with each
        request (`Environment.request_tools`), any other's are told in the system prompt."""
        self.tools, self.tool_format = tools, tool_format
        if tools and tool_format != CHAT_API_FORMAT:
            schemas = [t.schema for t in tools]
            self.messages = with_tool_prompt(self.messages, schemas, tool_format)

    @property
    def completion(self) -> str:
        """The last assistant message's text."""
        for message in reversed(self.messages):
            if message.get("role") == "assistant":
                return message.get("content") or ""
        return ""


def _cut(message: Message, limit: int) -> Message:
    """`message` with at most `limit` bytes of text: its string content, or the text parts
    of a list content, in order."""
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": _cut_text(content, limit)}
    if not isinstance(content, list):
        return message
    parts, left = [], limit
    for part in content:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            size = len(part["text"].encode())
            part = {**part, "text": _cut_text(part["text"], left)}
            left = max(left - size, 0)
        parts.append(part)
    return {**message, "content": parts}


def _cut_text(text: str, limit: int) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    kept = data[:limit].decode(errors="ignore")  # not half a character
    return (
        f"{kept}\n[cut at {limit} bytes of {len(data)}: messages from tools and the "
        "environment are cut at rollout.max_message_bytes]"
    )
