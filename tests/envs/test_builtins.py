"""What every built-in owes the rest of the system: loadable by name, tasks that serialise,
and episode state that is plain JSON so it lands in the trajectory unchanged."""

import json

import pytest

from reinforge.envs import load_environment
from reinforge.types import Task

from .scripted import ScriptedClient

BUILTINS = ["arithmetic", "tictactoe", "wordle", "calculator"]


@pytest.mark.parametrize("name", BUILTINS)
async def test_builtin_contract(name):
    env = load_environment(name)
    assert env.name == name and env.rubric.pass_threshold == 1.0
    assert 32 <= env.harness.max_tokens_per_turn <= 128
    tasks = env.tasks(5, seed=11)
    assert [Task.model_validate_json(t.model_dump_json()) for t in tasks] == tasks
    episode = await env.rollout(ScriptedClient(lambda messages: "5"), tasks[0])
    assert json.loads(json.dumps(episode.state)) == episode.state
    (scores,) = await env.rubric.score([episode])
    assert set(scores.rewards) == {term.key for term in env.rubric.terms}
