"""A scripted policy that speaks the `EpisodeClient.chat` protocol, for rollouts without a model.

It answers the way the server does (raw text as content, parsed tool calls alongside) and
holds environments to the client's contract: each call's messages must extend the previous
call's messages and reply unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from reinforge.envs.episode import Episode
from reinforge.policy.chat import parse_tool_calls
from reinforge.policy.client import Reply
from reinforge.types import Message, Task

Script = Callable[[list[Message]], str]
"""Chooses the next reply from the conversation so far."""


class ScriptedClient:
    """Replies from `script`: one function of the conversation, or a list of replies taken in
    order, each a text or a function of the conversation (to answer with a tool's result)."""

    def __init__(self, script: Script | Sequence[str | Script]) -> None:
        self._script = script if callable(script) else _in_order(script)
        self.prompts: list[list[Message]] = []
        """The messages of every call, as sent."""
        self._history: list[Message] = []

    async def chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
    ) -> Reply:
        assert messages[: len(self._history)] == self._history, "the environment rewrote history"
        self.prompts.append([dict(m) for m in messages])
        text = self._script(messages)
        message: Message = {"role": "assistant", "content": text}
        finish_reason = "stop"
        if tools:
            calls = parse_tool_calls(text).tool_calls
            if calls:
                message["tool_calls"] = calls
                finish_reason = "tool_calls"
        self._history = [*messages, message]
        return Reply(message, finish_reason)


def _in_order(replies: Sequence[str | Script]) -> Script:
    pending = iter(replies)

    def next_reply(messages: list[Message]) -> str:
        reply = next(pending, None)
        assert reply is not None, "the script ran out of replies"
        return reply if isinstance(reply, str) else reply(messages)

    return next_reply


def episode_of(task: Task, *texts: str, state: dict[str, Any] | None = None) -> Episode:
    """An episode of `task` whose assistant turns are `texts`: a hand-built grader input."""
    messages = [dict(m) for m in task.prompt]
    messages += [{"role": "assistant", "content": text} for text in texts]
    return Episode(task, messages, state or {}, turns=len(texts))
