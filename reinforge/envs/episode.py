"""The record of one rollout as the environment sees it: the rubric's input."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reinforge.envs.levels import Level
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
    sampled_token_ids: list[list[int]] = field(default_factory=list, repr=False)
    """The token ids the policy sampled, one list per turn, filled in by the rollout
    generator when the episode ends: what graders of length and repetition count."""
    resources: dict[str, Any] = field(default_factory=dict, repr=False)
    """Live per-episode objects (a sandbox); never serialised, released by `stop`."""

    @property
    def completion(self) -> str:
        """The last assistant message's text."""
        for message in reversed(self.messages):
            if message.get("role") == "assistant":
                return message.get("content") or ""
        return ""
