"""How an episode ends: a goal reached through a tool ends it ok, on any turn."""

import json

from reinforge.envs import Environment, Episode, Harness, tool
from reinforge.types import Task

from .scripted import ScriptedClient

TASK = Task(id="t", prompt=[{"role": "user", "content": "Find the number."}], answer=7)


@tool
def submit(number: int, episode: Episode) -> str:
    """Submit the number.

    Args:
        number: your answer
    """
    episode.state["solved"] = number == episode.task.answer
    return "right" if episode.state["solved"] else "wrong"


class Submit(Environment):
    def is_done(self, episode: Episode) -> bool:
        return episode.state.get("solved", False)


class NeverDone(Environment):
    pass


def call(number: int) -> str:
    payload = {"name": "submit", "arguments": {"number": number}}
    return f"<tool_call>\n{json.dumps(payload)}\n</tool_call>"


async def test_a_goal_reached_by_a_tool_on_the_last_turn_ends_ok():
    env = Submit(Harness(tools=[submit], max_turns=2))
    episode = await env.rollout(ScriptedClient([call(3), call(7)]), TASK)
    assert episode.turns == 2 and episode.state["solved"] and not episode.truncated


async def test_a_goal_reached_by_a_tool_ends_the_episode_early():
    env = Submit(Harness(tools=[submit], max_turns=5))
    episode = await env.rollout(ScriptedClient([call(7)]), TASK)
    assert episode.turns == 1 and not episode.truncated


async def test_without_is_done_running_out_of_turns_is_truncated():
    env = NeverDone(Harness(tools=[submit], max_turns=2))
    episode = await env.rollout(ScriptedClient([call(3), call(7)]), TASK)
    assert episode.turns == 2 and episode.truncated
