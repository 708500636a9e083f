"""The sub-agent tool (`env.augment.subagent`): the model hands a task to a helper, a nested
episode of the same policy offered the same tools but this one, and the helper's final
answer comes back as the tool's result.

The tool runs the helper itself (`SubAgent.run`), through the environment's agent loop and
the rollout's client, which the loop hands it. The helper samples through an episode
client of its own, so none of its tokens join the outer trajectory's record: to the outer
policy its answer is a tool's output, left out of the loss like any other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from reinforge.envs.episode import Episode
from reinforge.envs.tools import Tool, ToolResult
from reinforge.types import Section

if TYPE_CHECKING:
    from reinforge.envs.environment import Environment, Step
    from reinforge.policy.client import ChatClient, EpisodeClient

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
    return task  # the checked argument; `SubAgent.run` runs the helper on it


class SubAgent(Tool):
    """The tool as offered: its schema, and a call that checks the arguments and runs the
    task they give as a nested episode."""

    def __init__(self, config: SubAgentConfig) -> None:
        super().__init__(subagent)
        self.max_turns = config.max_turns

    async def run(
        self,
        arguments: str | dict[str, Any],
        episode: Episode,
        environment: Environment,
        client: ChatClient,
    ) -> ToolResult:
        """Run the task as a nested episode of the same policy, sharing this episode's
        task, state and resources (its sandbox), offered its tools but the sub-agent in its
        format; the helper's final answer is the result."""
        given = await self.call(arguments)
        if given.error:
            return given
        helper_client = _helper_client(client, environment.harness.max_total_tokens)
        episode.state[SUBAGENT_CALLS] = episode.state.get(SUBAGENT_CALLS, 0) + 1
        helper = Episode(
            episode.task,
            [{"role": "user", "content": given.content}],
            episode.state,
            resources=episode.resources,
            max_message_bytes=episode.max_message_bytes,
        )
        tools = environment.episode_tools(episode).values()
        helper.offer_tools([t for t in tools if not isinstance(t, SubAgent)], episode.tool_format)
        await environment.agent_loop(helper_client, helper, self.max_turns, _answer)
        if helper.truncated:
            return ToolResult(
                f"Error: the sub-agent did not finish in {self.max_turns} turns of at most "
                f"{environment.harness.max_tokens_per_turn} tokens",
                error=True,
            )
        return ToolResult(helper.completion)


async def _answer(episode: Episode) -> Step:
    """A sub-agent's turn without a tool call is its answer."""
    from reinforge.envs.environment import Finished  # here, as in `_helper_client`

    return Finished()


def _helper_client(client: ChatClient, max_total_tokens: int | None) -> EpisodeClient:
    """A client of the rollout's engines for a sub-agent's episode, with a token record of
    its own. Its seed follows from the turns the rollout has taken, so a rerun of a seeded
    rollout samples the same helper."""
    # Here, not above: `SubAgentConfig` is read with every config, and the policy client
    # (openai) is not worth loading for it.
    from reinforge.policy.client import EpisodeClient

    if not isinstance(client, EpisodeClient):
        raise TypeError("the sub-agent tool needs the rollout's EpisodeClient")
    seed = None if client.seed is None else client.seed + len(client.turns)
    return EpisodeClient(client.route, max_total_tokens, seed, client.lost)
