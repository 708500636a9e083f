"""Recipes: what a run adds to any environment with no change to the environment (a
reasoning level per rollout, a harness variant, reward terms of its own).

The rollout generator runs the harness's recipes around every rollout alike: each draws
what the rollout gets before it starts, prepares the fresh episode with it and records it
on the trajectory; `Environment.add_recipes` adds their reward terms after the
environment's own. This protocol is all the environment API knows of them: the recipes
that a run's `env` section asks for are built by the recipes annex, which imports this
protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from reinforge.types import Task

if TYPE_CHECKING:
    from reinforge.envs.episode import Episode
    from reinforge.envs.rubric import Term

Drawn = TypeVar("Drawn")


@dataclass(frozen=True)
class Rollout:
    """One rollout of a run: what a recipe's draws follow from, so that a rerun with the
    same seed draws the same."""

    task: Task
    index: int
    """Its place among its task's rollouts."""
    seed: int | None
    """The run's sampling seed; None: unseeded."""

    @property
    def key(self) -> str:
        """The rollout's own key, which seeds its draws (and its sampling seed)."""
        return f"{self.seed}/{self.task.id}/{self.index}"


class Recipe(Protocol[Drawn]):
    """Something a run adds to every rollout of an environment: `Drawn` is what one
    rollout gets (a reasoning level, a harness variant; None for a recipe of reward terms
    alone)."""

    def draw(self, rollout: Rollout) -> Drawn:
        """What `rollout` gets, drawn before it starts: a draw that fails (a task without
        a field the recipe needs) is the run's mistake, not one rollout's error."""
        ...

    def prepare(self, drawn: Drawn, episode: Episode) -> None:
        """Give the fresh episode what was drawn, before its first turn: a system line,
        the tools as the rollout is shown them, per-episode records of the recipe's own
        (`Episode.extras`)."""
        ...

    def record(self, drawn: Drawn, info: dict[str, Any]) -> None:
        """Put what was drawn into the trajectory's `info`, however the rollout ended."""
        ...

    def terms(self) -> Sequence[Term]:
        """Reward terms that join the rubric after the environment's own."""
        ...
