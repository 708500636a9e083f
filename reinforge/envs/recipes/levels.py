"""Reasoning levels: each rollout is told a level and its token budget, and going over the
budget costs the whole reward.

`ReasoningLevels` is a recipe: the rollout generator has it draw one level per rollout
from the rollout's seed (a rerun draws the same), tell the model its level and budget in a
system line, and record both on the trajectory (`info["reasoning_level"]`,
`info["budget"]`). Its rubric term `over_budget` then sets the total to
`over_budget_reward` (-1) when the episode sampled more tokens than its budget, whatever
the answer. The budget is a promise the model is held to, not a limit: nothing stops
generation at it, unlike truncation at the harness's hard token limits.
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

from pydantic import Field, model_validator

from reinforge.envs.recipe import Rollout
from reinforge.envs.rubric import Override
from reinforge.errors import UsageError
from reinforge.types import Message, Record, Section, Status, Task, Trajectory

if TYPE_CHECKING:
    from reinforge.envs.episode import Episode


@dataclass(frozen=True)
class Level:
    """The level one rollout was given."""

    name: str
    budget: int
    """Sampled tokens the episode may use, over all its turns."""
    line: str
    """What the model is told: the level's system line."""

    def tell(self, messages: list[Message]) -> list[Message]:
        """`messages` with the level's line added to their system prompt, or as one."""
        if messages and messages[0].get("role") == "system":
            system = {
                **messages[0],
                "content": f"{messages[0].get('content') or ''}\n\n{self.line}",
            }
            return [system, *messages[1:]]
        return [{"role": "system", "content": self.line}, *messages]


class ReasoningLevels(Section):
    """Reasoning levels with token budgets, drawn per rollout and told to the model."""

    budgets: dict[str, int]
    """Each level's token budget (at least 1), e.g. `{ low = 64, high = 512 }`."""
    mix: dict[str, float] = Field(default_factory=dict)
    """How often each level is drawn, relative to the others; a level left out is never
    drawn. Empty: every level equally often."""
    scale_by: str | None = None
    """A numeric `task.info` field that multiplies every budget (harder tasks get more
    tokens), e.g. "difficulty"; None: the budgets as given."""
    prompt: str = "Reasoning level: {level}. Use at most {budget} tokens."
    """The system line that tells the model its level (`{level}`) and budget (`{budget}`),
    added after the environment's own system prompt, or as one when it has none."""
    over_budget_reward: float = -1.0
    """The total reward of an episode that sampled more tokens than its budget."""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if not self.budgets:
            raise ValueError("budgets names no level")
        if min(self.budgets.values()) < 1:
            raise ValueError("every budget must be at least 1 token")
        if self.mix and min(self.mix.values()) < 0:
            raise ValueError("mix weights must not be negative")
        unknown = sorted(set(self.mix) - set(self.budgets))
        if unknown:
            raise ValueError(f"mix names levels with no budget: {', '.join(unknown)}")
        if self.mix and sum(self.mix.values()) <= 0:
            raise ValueError("mix gives every level weight 0")
        try:
            self.prompt.format(level="low", budget=1)
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(f"prompt may use only {{level}} and {{budget}}: {error}") from error
        return self

    def draw(self, rollout: Rollout) -> Level:
        """The level of one rollout; its key (the run's seed, the task and the rollout's
        index) decides it."""
        names = list(self.mix or self.budgets)
        weights = [self.mix.get(name, 1.0) for name in names]
        name = random.Random(rollout.key).choices(names, weights)[0]
        budget = self._budget(rollout.task, name)
        return Level(name, budget, self.prompt.format(level=name, budget=budget))

    def prepare(self, drawn: Level, episode: Episode) -> None:
        """Tell the model its level in a system line, and keep it for `over_budget`."""
        episode.extras[Level] = drawn
        episode.messages = drawn.tell(episode.messages)

    def record(self, drawn: Level, info: dict[str, Any]) -> None:
        info.update(reasoning_level=drawn.name, budget=drawn.budget)

    def terms(self) -> list[Override]:
        return [Override(over_budget, self.over_budget_reward)]

    def _budget(self, task: Task, name: str) -> int:
        budget = self.budgets[name]
        if self.scale_by is None:
            return budget
        value = task.info.get(self.scale_by)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UsageError(
                f"env.levels.scale_by: task {task.id!r} has no numeric info field "
                f"{self.scale_by!r} (got {value!r})"
            )
        return max(1, round(budget * value))


def over_budget(episode: Episode) -> bool:
    """Whether the episode sampled more tokens than its level's budget: an `Override` of
    the rubric's total. An episode without a level is never over."""
    level: Level | None = episode.extras.get(Level)
    if level is None:
        return False
    return sum(len(turn) for turn in episode.sampled_token_ids) > level.budget


class LevelStats(Record):
    """One reasoning level's rollouts in a summary."""

    rollouts: int
    over_budget_rate: float
    """Fraction of the level's rollouts that sampled more tokens than its budget."""
    completion_tokens_mean: float
    reward_mean: float
    """Over the level's scored rollouts (0 when none was scored)."""


def level_metrics(trajectories: list[Trajectory]) -> dict[str, LevelStats]:
    """Per level, by name; empty when no rollout had a level."""
    by_level: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        if "reasoning_level" in trajectory.info:
            by_level[trajectory.info["reasoning_level"]].append(trajectory)
    metrics: dict[str, LevelStats] = {}
    for name, group in sorted(by_level.items()):
        over = [t.completion_tokens > t.info["budget"] for t in group]
        rewards = [t.reward for t in group if t.status in (Status.OK, Status.TRUNCATED)]
        metrics[name] = LevelStats(
            rollouts=len(group),
            over_budget_rate=sum(over) / len(group),
            completion_tokens_mean=statistics.fmean(t.completion_tokens for t in group),
            reward_mean=statistics.fmean(r or 0.0 for r in rewards) if rewards else 0.0,
        )
    return metrics
