"""The simulated trainer: the loop's trainer side, in simulated time."""

from __future__ import annotations

from collections import Counter, deque
from typing import TYPE_CHECKING

from reinforge.orchestrate.metrics import StepTime
from reinforge.sim.events import SimGroup, SimStep

if TYPE_CHECKING:
    from reinforge.sim.pipeline import Simulation


class Trainer:
    """Collects a step's groups, trains, syncs; records each step as the loop does."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.version = 0
        self.finished: deque[SimGroup] = deque()
        self.kept: list[SimGroup] = []
        self.dropped = 0
        self.redrawn = 0
        """Of `kept`, the uniform groups set aside: not counted among the step's groups."""
        self.training = False
        self.collecting = True
        self.steps: list[SimStep] = []
        self._step_start = 0.0
        self._phase_start = 0.0
        self._idle_s = 0.0
        self._train_s = 0.0
        self._work_left = 0.0
        self._rate = 1.0
        self._rate_since = 0.0
        self._finish_event = 0
        self._busy_mark = 0.0

    def offer(self, group: SimGroup) -> None:
        self.finished.append(group)
        if self.collecting:
            self._collect()

    def _collect(self) -> None:
        """As the loop's `_collect`: a dropped group, and a uniform one set aside while the
        step's redraws last, gives its slot back at once, so the next task starts in its
        place; the step waits for `tasks_per_step` groups beyond those set aside."""
        shape = self.sim.shape
        while self.finished and len(self.kept) < shape.tasks_per_step + self.redrawn:
            group = self.finished.popleft()
            if self.version - group.oldest_version > shape.max_staleness:
                self.dropped += 1
                self.sim.rollouts.release(1)
                continue
            self.kept.append(group)
            if self.redrawn < shape.uniform_redraws and group.cost.uniform:
                self.redrawn += 1
                self.sim.rollouts.release(1)
        if len(self.kept) == shape.tasks_per_step + self.redrawn:
            self.collecting = False
            self._train()

    def _train(self) -> None:
        clock = self.sim.clock
        self._idle_s = clock.now - self._step_start
        self._phase_start = clock.now
        tokens = sum(g.cost.trained_tokens for g in self.kept)
        if not tokens:  # every group uniform: nothing to learn, no step, no sync
            self._train_s = 0.0
            self._end_step(sync_s=0.0)
            return
        if self.sim.shape.mode == "partial":
            self.sim.pause_engines(True)
        self.training = True
        self._work_left = self.sim.profile.trainer.seconds(tokens, self.sim.layout.trainers)
        self._rate_since = clock.now
        self._rate = self._current_rate()
        self._schedule_finish()

    def _current_rate(self) -> float:
        shared = self.sim.layout.colocated and any(e.running for e in self.sim.engines)
        return 1.0 / self.sim.profile.sharing.train if shared else 1.0

    def rate_may_change(self) -> None:
        """Processor sharing: the work left drains at the new rate from now on."""
        if not self.training:
            return
        rate = self._current_rate()
        if rate != self._rate:
            now = self.sim.clock.now
            self._work_left -= (now - self._rate_since) * self._rate
            self._rate, self._rate_since = rate, now
            self._schedule_finish()

    def _schedule_finish(self) -> None:
        self._finish_event += 1
        event = self._finish_event
        seconds = max(self._work_left, 0.0) / self._rate
        self.sim.clock.after(seconds, lambda: self._trained(event))

    def _trained(self, event: int) -> None:
        if event != self._finish_event:
            return  # rescheduled at another rate
        self.training = False
        clock = self.sim.clock
        self._train_s = clock.now - self._phase_start
        self.sim.pause_engines(True)  # the weights change between two decode steps
        sync_s = self.sim.sync_s
        clock.after(sync_s, lambda: self._synced(sync_s))

    def _synced(self, sync_s: float) -> None:
        self.version += 1
        for engine in self.sim.engines:
            engine.update(self.version)
        self._end_step(sync_s, trained_version=self.version - 1)
        # a partial step that could train at once has paused the engines again, before
        # the groups just released could start (the trainer takes the lock first)
        if not (self.training and self.sim.shape.mode == "partial"):
            self.sim.pause_engines(False)

    def _end_step(self, sync_s: float, trained_version: int | None = None) -> None:
        clock = self.sim.clock
        staleness: Counter[int] = Counter()
        samples = 0
        for group in self.kept:
            for rollout in group.rollouts:
                if rollout.trained and trained_version is not None:
                    samples += 1
                    for version, count in rollout.versions.items():
                        staleness[trained_version - version] += count
        busy = sum(e.busy_s() for e in self.sim.engines)
        self.steps.append(
            SimStep(
                time=StepTime(
                    trainer_idle_s=self._idle_s,
                    train_s=self._train_s,
                    sync_s=sync_s,
                    rollout_idle_s=self.sim.rollouts.take_idle_s(),
                    total_s=clock.now - self._step_start,
                ),
                trained_samples=samples,
                taken_rollouts=sum(len(g.rollouts) for g in self.kept),
                dropped_stale=self.dropped,
                redrawn=self.redrawn,
                staleness=staleness,
                sampler_busy_s=busy - self._busy_mark,
                slots=tuple(sorted(g.slot for g in self.kept)),
                policy_version=self.version,
            )
        )
        self._busy_mark = busy
        self._step_start = clock.now
        self.kept, self.dropped, self.redrawn = [], 0, 0
        self.collecting = True
        # the set-aside groups gave their slots back as they came
        self.sim.rollouts.release(self.sim.shape.tasks_per_step)
        self._collect()
