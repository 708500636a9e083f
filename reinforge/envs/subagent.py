"""The sub-agent tool (`env.augment.subagent`): the model hands a task to a helper, a nested
episode of the same policy offered the same tools but this one, and the helper's final
answer comes back as the tool's result.

The environment runs the helper (`Environment._delegate`), since only it holds the
rollout's client. The helper samples through an episode client of its own, so none of its
tokens join the outer trajectory's record: to the outer policy its answer is a tool's
output, left out of the loss like any other.
"""

from __future__ import annotations

from pydantic import Field

from reinforge.envs.tools import Tool
from reinforge.types import Section

SUBAGENT_CALLS = "subagent_calls"
"""The `episode.state` entry, and so the trajectory's `info` entry, counting the calls of a
rollout that was offered the tool."""


class SubAgentConfig(Section):
    """A `subagent` tool: the task it is given runs as a nested episode of the same policy,
    offered the rollout's other tools, and its final answer is the tool's result."""

    rate: float = Field(1.0, ge=0.0, le=1.0)
    """How often a rollout is offered the tool."""
    max_turns: int = Field(4, ge=1)
    """Turns the helper may take (each of the harness's `max_tokens_per_turn`); a helper
    without an answer by then fails the call."""


def subagent(task: str) -> str:
    """Hand a task to a helper agent that has your other tools. It works on it alone and
    its final answer comes back.

    Args:
        task: The task, with everything the helper needs to know: it sees nothing else.
    """
    return task  # the checked argument; the environment runs the helper on it


class SubAgent(Tool):
    """The tool as offered: its schema, and a call that checks the arguments and gives the
    task back for the environment to run."""

    def __init__(self, config: SubAgentConfig) -> None:
        super().__init__(subagent)
        self.max_turns = config.max_turns
