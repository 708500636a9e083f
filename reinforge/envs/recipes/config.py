"""A run's `env` config section: the environment's own settings (`EnvConfig`) and what the
run adds to any environment (reasoning levels and harness variants in its harness; a
token-budget override, a loop penalty, judged criteria and a conciseness bonus in its
rubric), built here as recipes. The environment's own terms come first and keep their
names and weights, so no environment changes to take part.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field

from reinforge.envs.config import EnvConfig
from reinforge.envs.recipes.augment import HarnessAugmentation, HarnessVariants
from reinforge.envs.recipes.conciseness import conciseness
from reinforge.envs.recipes.judge import Judge, JudgeConfig
from reinforge.envs.recipes.levels import ReasoningLevels
from reinforge.envs.recipes.loops import looping
from reinforge.envs.recipes.subagent import subagent
from reinforge.envs.rubric import GroupReward, Reward, Term
from reinforge.errors import UsageError

if TYPE_CHECKING:
    from reinforge.envs.environment import Environment
    from reinforge.envs.episode import Episode
    from reinforge.envs.recipe import Recipe, Rollout


class RecipesConfig(EnvConfig):
    """Which environment, and what a run adds to any environment: docs/recipes.md."""

    levels: ReasoningLevels | None = None
    """An episode over its budget scores `over_budget_reward` whatever its answer (rubric
    term `over_budget`). docs/recipes.md."""
    augment: HarnessAugmentation | None = None
    """Vary the harness per rollout (system prompt, tool names, descriptions and order,
    notes, tool-call format, a sub-agent tool); None: every rollout meets the environment's
    harness. docs/recipes.md."""
    loop_penalty: float = Field(0.0, ge=0.0)
    """Subtracted from the reward of an episode with a looping turn (rubric term
    `looping`); 0: no term. Loop rates are reported either way."""
    judge: JudgeConfig | None = None
    """Each criterion is a rubric term under its own name; a verdict that fails makes the
    rollout an error. docs/recipes.md."""
    conciseness: float = Field(0.0, ge=0.0)
    """Weight of a bonus from +0.5 for the group's shortest episode to -0.5 for its longest
    (rubric term `conciseness`); keep it below the reward gap between a right and a wrong
    answer. 0: no term."""

    def apply(self, environment: Environment) -> None:
        """The environment's own settings, then the recipes the section asks for."""
        super().apply(environment)
        recipes = self.recipes(environment)
        try:
            environment.add_recipes(*recipes)
        except ValueError as error:  # a judged criterion named like one of the env's terms
            raise UsageError(f"environment {environment.name!r}: {error}") from error

    def recipes(self, environment: Environment) -> list[Recipe[Any]]:
        """The recipes the section asks for, in the order they prepare an episode: the
        harness variant first, whose system prompt the level's line follows."""
        recipes: list[Recipe[Any]] = []
        if self.augment is not None:
            tools = list(environment.harness.tools)
            offered_names = [t.name for t in tools]
            unknown = self.augment.unknown_tools(tools)
            if unknown:
                offered = ", ".join(offered_names) or "none"
                raise UsageError(
                    f"env.augment names tools that {environment.name!r} does not offer: "
                    f"{', '.join(unknown)} (its tools: {offered})"
                )
            if self.augment.subagent is not None and subagent.__name__ in offered_names:
                raise UsageError(
                    f"env.augment.subagent: {environment.name!r} has a tool named "
                    f"{subagent.__name__!r} already"
                )
            recipes.append(HarnessVariants(self.augment, tools))
        if self.levels is not None:
            recipes.append(self.levels)
        terms: list[Term] = []
        if self.loop_penalty > 0:
            terms.append(Reward(looping, -self.loop_penalty))
        if self.judge is not None:
            terms.extend(Judge(self.judge).terms())
        if self.conciseness > 0:
            terms.append(GroupReward(conciseness, self.conciseness))
        if terms:
            recipes.append(Terms(terms))
        return recipes


class Terms:
    """A recipe of reward terms alone (a loop penalty, judged criteria, a conciseness
    bonus): nothing to draw, prepare or record."""

    def __init__(self, terms: Sequence[Term]) -> None:
        self._terms = list(terms)

    def draw(self, rollout: Rollout) -> None:
        return None

    def prepare(self, drawn: None, episode: Episode) -> None:
        return None

    def record(self, drawn: None, info: dict[str, Any]) -> None:
        return None

    def terms(self) -> list[Term]:
        return self._terms
