"""The record of one rollout as the environment sees it: the rubric's input."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reinforge.envs.levels import Level
from reinforge.policy.chat import CHAT_API_FORMAT, ToolFormat, with_tool_prompt
from reinforge.types import Message, Task

if TYPE_CHECKING:
    from reinforge.envs.tools import Tool


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
    level: Level | None = None
    """The reasoning level the rollout was given, when the run draws levels."""
    tools: list[Tool] | None = None
    """The tools as this rollout was shown them, when the run varies the harness (renamed,
    redescribed, reordered); None: the harness's."""
    tool_format: ToolFormat = CHAT_API_FORMAT
    """How the model was asked to write tool calls. Hermes is the chat API's: the tools go
    with each request, and the server tells them to the model and parses its calls; any
    other format is told in the system prompt (`offer_tools`) and read from the text."""
    sampled_token_ids: list[list[int]] = field(default_factory=list, repr=False)
    """The token ids the policy sampled, one list per turn, filled in by the rollout
    generator when the episode ends: what graders of length and repetition count."""
    resources: dict[str, Any] = field(default_factory=dict, repr=False)
    """Live per-episode objects (a sandbox); never serialised, released by `stop`."""

    def offer_tools(
        self, tools: list[Tool], tool_format: ToolFormat
    ) -> list[dict[str, Any]] | None:
        """Offer `tools`, to be called in `tool_format`; the schemas that go with each chat
        request (None where the system prompt tells them)."""
        self.tools, self.tool_format = tools, tool_format
        schemas = [t.schema for t in tools]
        if not schemas:
            return None
        if tool_format == CHAT_API_FORMAT:
            return schemas
        self.messages = with_tool_prompt(self.messages, schemas, tool_format)
        return None

    @property
    def completion(self) -> str:
        """The last assistant message's text."""
        for message in reversed(self.messages):
            if message.get("role") == "assistant":
                return message.get("content") or ""
        return ""
