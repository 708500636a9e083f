"""For every built-in environment and engine: the token record is exactly what the engine
sampled.

Decoding a trajectory's tokens reproduces the conversation, and every sampled span is
exactly one completion the engine produced for exactly the tokens before it.
"""

from __future__ import annotations

import json

import pytest

from reinforge.envs.registry import installed_environments, load_environment
from reinforge.policy.chat import ChatFormat
from reinforge.policy.client import PolicyClient
from reinforge.policy.config import SamplingConfig
from reinforge.policy.records import token_record_problems
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_groups
from reinforge.types import Trajectory, masked_spans

from .commands import reinforge_here

BUILTINS = ["arithmetic", "calculator", "tictactoe", "wordle"]


def test_every_builtin_is_covered():
    assert set(BUILTINS) <= set(installed_environments())


@pytest.mark.parametrize("name", BUILTINS)
async def test_builtin_trajectories_are_token_exact(name, any_engine, chat_format):
    engine = any_engine.engine
    env = load_environment(name)
    client = PolicyClient.for_engine(engine, SamplingConfig())
    env.harness.max_tokens_per_turn = 16
    groups = await generate_groups(env, env.tasks(3, seed=5), client, RolloutConfig(), 2, 5)
    sampled_for: dict[tuple[int, ...], list[list[int]]] = {}
    for prompt, completion in engine.log:
        sampled_for.setdefault(tuple(prompt), []).append(completion.token_ids)
    for trajectory in (t for g in groups for t in g.trajectories):
        assert trajectory.error is None
        assert token_record_problems(trajectory, chat_format, env.harness.tool_schemas) == []
        for start, end in masked_spans(trajectory.loss_mask):
            assert (
                trajectory.token_ids[start:end] in sampled_for[tuple(trajectory.token_ids[:start])]
            )


@pytest.mark.slow
def test_tictactoe_on_smollm2_is_multi_turn_and_token_exact(tmp_path):
    out = tmp_path / "ttt"
    result = reinforge_here(
        "eval",
        "tictactoe",
        "--model",
        "smollm2-135m",
        "--tasks",
        "8",
        "--rollouts",
        "2",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    env = load_environment("tictactoe")
    chat = ChatFormat(_smollm2_tokenizer())
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    trajectories = [Trajectory.model_validate(row) for row in rows]
    assert len(trajectories) == 16
    assert max(t.turns for t in trajectories) >= 2  # real multi-turn games happened
    for trajectory in trajectories:
        assert trajectory.error is None
        assert token_record_problems(trajectory, chat, env.harness.tool_schemas) == []


def _smollm2_tokenizer():
    from reinforge.policy.models import load_tokenizer

    return load_tokenizer("smollm2-135m")
