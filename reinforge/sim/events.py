"""The simulation's clock and what moves through it: groups, rollouts, an engine's turn
requests, and the record of a simulated step (`pipeline.py` plays them)."""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reinforge.orchestrate.metrics import StepTime
from reinforge.sim.workload import GroupCost, RolloutCost

if TYPE_CHECKING:
    from reinforge.sim.pipeline import Engine


@dataclass
class SimStep:
    """One simulated step, in the terms of a metrics.jsonl line."""

    time: StepTime
    trained_samples: int
    taken_rollouts: int
    """Rollouts of the step's groups, trained or not, set aside or not."""
    dropped_stale: int
    redrawn: int
    """Uniform groups set aside, the next tasks drawn in their place (`loop.uniform_redraws`)."""
    staleness: Counter[int]
    """Trained tokens by staleness (trainer version minus the version that sampled them)."""
    sampler_busy_s: float
    """Engine iteration seconds in the step, summed over the engines."""
    slots: tuple[int, ...] = ()
    """The step's groups (set aside or not; not the dropped ones) by slot of the data
    order, in that order: the groups a run records for the step."""
    policy_version: int = 0
    """The engines' policy version after the step's weight sync (unchanged when every
    group was uniform: nothing trained, nothing synced)."""


class Clock:
    """A heap of (time, order, action)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = 0

    def after(self, seconds: float, action: Callable[[], None]) -> None:
        self._order += 1
        heapq.heappush(self._events, (self.now + seconds, self._order, action))

    def run(self, until: Callable[[], bool]) -> None:
        while not until():
            if not self._events:
                raise RuntimeError("the simulation stalled: no event left (a bug)")
            self.now, _, action = heapq.heappop(self._events)
            action()


@dataclass
class SimGroup:
    slot: int
    """Its place in the data order: steps x tasks per step + task index."""
    cost: GroupCost
    episodes_left: int
    rollouts: list[SimRollout] = field(default_factory=list)

    @property
    def oldest_version(self) -> int:
        return min(min(r.versions) for r in self.rollouts)


@dataclass
class SimRollout:
    cost: RolloutCost
    group: SimGroup
    trained: bool
    engine: Engine | None = None
    turn: int = 0
    versions: Counter[int] = field(default_factory=Counter)
    """Sampled tokens by policy version."""


@dataclass(eq=False)
class SimRequest:
    """One turn of a rollout, waiting for or in an engine's batch."""

    rollout: SimRollout
    tokens: int
    new_tokens: int
    """To prefill (the prompt, or the turn's context after the cached prefix)."""
    first: int = 0
    """The iteration that admitted it."""

    @property
    def last(self) -> int:
        """The iteration whose decode gives its last token: two come in the first (the
        prefill's and the decode's), one in each after."""
        return self.first + max(self.tokens - 2, 0)
