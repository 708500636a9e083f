"""Reasoning levels: drawn per rollout from its seed, told to the model by the harness,
recorded on the trajectory; an episode over its budget scores -1 whatever its answer."""

from __future__ import annotations

import pytest

from reinforge.config import Config, load_config
from reinforge.envs.episode import Episode
from reinforge.envs.recipe import Rollout
from reinforge.envs.recipes.config import RecipesConfig
from reinforge.envs.recipes.levels import Level, ReasoningLevels
from reinforge.envs.registry import load_configured
from reinforge.errors import ConfigError, UsageError
from reinforge.policy.client import PolicyClient
from reinforge.policy.config import SamplingConfig
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_groups
from reinforge.rollout.summary import summarize
from reinforge.types import Status, Task

TASK = Task(
    id="t", prompt=[{"role": "user", "content": "What is 40 + 2?"}], answer=42, info={"size": 3}
)
ROLLOUT = Rollout(TASK, 0, 0)
LEVELS = ReasoningLevels(budgets={"low": 4, "high": 100})


def test_a_level_is_drawn_from_the_rollout_seed_and_the_mix():
    rollouts = [Rollout(TASK, i, 0) for i in range(40)]
    drawn = [LEVELS.draw(rollout).name for rollout in rollouts]
    assert drawn == [LEVELS.draw(rollout).name for rollout in rollouts]  # the same seed, the same
    assert set(drawn) == {"low", "high"}
    only_high = ReasoningLevels(budgets={"low": 4, "high": 100}, mix={"high": 1.0})
    assert {only_high.draw(rollout).name for rollout in rollouts} == {"high"}


def test_the_budget_scales_with_a_task_field():
    scaled = ReasoningLevels(budgets={"low": 4}, scale_by="size")
    assert scaled.draw(ROLLOUT).budget == 12  # 4 x size 3
    with pytest.raises(UsageError, match="no numeric info field 'depth'"):
        ReasoningLevels(budgets={"low": 4}, scale_by="depth").draw(ROLLOUT)


def test_the_level_line_joins_the_system_prompt_or_becomes_one():
    level = LEVELS.draw(ROLLOUT)
    line = f"Reasoning level: {level.name}. Use at most {level.budget} tokens."
    assert level.line == line
    assert level.tell(TASK.prompt) == [{"role": "system", "content": line}, *TASK.prompt]
    system = {"role": "system", "content": "Be brief."}
    told = level.tell([system, *TASK.prompt])
    assert told[0] == {"role": "system", "content": f"Be brief.\n\n{line}"}
    assert told[1:] == TASK.prompt


@pytest.mark.parametrize(
    "override, message",
    [
        ("env.levels.budgets={}", "budgets names no level"),
        ("env.levels.mix={medium=1}", "mix names levels with no budget: medium"),
        ("env.levels.mix={low=0}", "mix gives every level weight 0"),
        ('env.levels.prompt="{effort}"', "prompt may use only {level} and {budget}"),
        ("env.levels.budgets={low=0}", "every budget must be at least 1 token"),
        ("env.levels.mix={low=-1}", "mix weights must not be negative"),
    ],
)
def test_bad_levels_are_one_clear_line(override, message):
    with pytest.raises(ConfigError, match="env.levels") as error:
        load_config(Config, None, ["env.levels.budgets={low=4}", override])
    assert message in str(error.value)


async def test_an_over_budget_correct_answer_scores_minus_one():
    env = load_configured(RecipesConfig(name="arithmetic", levels=LEVELS))
    within = _episode(Level("low", 4, ""), sampled=[[1, 2, 3, 4]])
    over = _episode(Level("low", 4, ""), sampled=[[1, 2, 3], [4, 5]])  # 5 over two turns
    no_level = _episode(None, sampled=[[1] * 50])
    scores = await env.rubric.score([within, over, no_level])
    # correct 1 + format 0.1 x 1 = 1.1 within the budget; over it, -1 whatever the answer
    assert [s.total for s in scores] == [1.1, -1.0, 1.1]  # type: ignore[union-attr]
    assert scores[1].rewards == {"correct": 1.0, "format": 1.0, "over_budget": 1.0}  # type: ignore[union-attr]
    assert scores[0].rewards["over_budget"] == 0.0  # type: ignore[union-attr]


async def test_levels_through_the_rollout_generator(tiny_engine):
    """The real engine: the level's line reaches the model, the trajectory records the
    level, and the reward is -1 exactly where the sampled tokens exceed the budget."""
    levels = ReasoningLevels(budgets={"low": 2, "high": 100}, over_budget_reward=-1.0)
    env = load_configured(
        RecipesConfig(name="arithmetic", levels=levels, max_tokens_per_turn=6, args={})
    )
    client = PolicyClient.for_engine(tiny_engine, SamplingConfig())
    groups = await generate_groups(env, env.tasks(3, seed=1), client, RolloutConfig(), 4, 7)
    trajectories = [t for g in groups for t in g.trajectories]
    assert {t.info["reasoning_level"] for t in trajectories} == {"low", "high"}
    assert {t.completion_tokens > t.info["budget"] for t in trajectories} == {True, False}
    for trajectory in trajectories:
        level, budget = trajectory.info["reasoning_level"], trajectory.info["budget"]
        assert budget == levels.budgets[level]
        assert trajectory.messages[0]["role"] == "system"
        assert trajectory.messages[0]["content"].endswith(
            f"Reasoning level: {level}. Use at most {budget} tokens."
        )
        assert trajectory.status in (Status.OK, Status.TRUNCATED)
        over = trajectory.completion_tokens > budget
        assert (trajectory.reward == -1.0) == over
        assert trajectory.rewards["over_budget"] == float(over)
    again = await generate_groups(env, env.tasks(3, seed=1), client, RolloutConfig(), 4, 7)
    assert [t.info for g in again for t in g.trajectories] == [t.info for t in trajectories]
    metrics = summarize(groups, 1.0).levels
    assert set(metrics) == {"low", "high"}
    low = [t for t in trajectories if t.info["reasoning_level"] == "low"]
    assert metrics["low"].rollouts == len(low)
    assert metrics["low"].over_budget_rate == sum(t.completion_tokens > 2 for t in low) / len(low)


def _episode(level: Level | None, sampled: list[list[int]]) -> Episode:
    messages = [*TASK.prompt, {"role": "assistant", "content": "42"}]
    episode = Episode(TASK, messages, turns=1, sampled_token_ids=sampled)
    if level is not None:
        episode.extras[Level] = level
    return episode
