"""What the rollouts cost: per group, its rollouts' tokens, turns and environment time, and
how long grading holds the group, either read from a run's trajectories or drawn from
lognormal laws.

A group is the unit, not a rollout: a task's rollouts are alike (a task that asks for a
long answer makes all of them long), and a run keeps that likeness when its groups are
replayed or resampled whole.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import ValidationError

from reinforge.errors import UsageError
from reinforge.sim.config import Lognormal, ParametricWorkload
from reinforge.train.config import TrainerConfig
from reinforge.train.distill import DistillConfig
from reinforge.train.trainer import rewards_vary, select_for_training
from reinforge.types import Group, Status, Task, Trajectory, masked_spans


@dataclass(frozen=True)
class RolloutCost:
    prompt_tokens: int
    """The first turn's prompt."""
    completion_tokens: int
    """Sampled by the policy, over every turn."""
    context_tokens: int
    """Added between turns (tool results, the environment's replies)."""
    turns: int
    env_s: float
    """In tools and the environment, spread evenly after each turn."""

    @property
    def sequence_tokens(self) -> int:
        """What the trainer runs forward and backward."""
        return self.prompt_tokens + self.completion_tokens + self.context_tokens

    def turn_tokens(self) -> list[int]:
        """The completion split over the turns, the remainder on the first ones."""
        share, extra = divmod(self.completion_tokens, self.turns)
        return [share + (turn < extra) for turn in range(self.turns)]

    def turn_prompt_tokens(self, turn: int) -> int:
        """New tokens the engine prefills for `turn`: the prompt, then each turn's share of
        the context (the earlier turns are in its prefix cache)."""
        if turn == 0:
            return self.prompt_tokens
        return max(self.context_tokens // max(self.turns - 1, 1), 1)


@dataclass(frozen=True)
class GroupCost:
    rollouts: tuple[RolloutCost, ...]
    grade_s: float
    """From the last rollout's end to the group's scores (graded together)."""
    trained: tuple[bool, ...]
    """Per rollout: whether the trainer takes it (not when the group's rewards are equal)."""
    uniform: bool
    """No two of its trainable rollouts' rewards differ (`rewards_vary` is false; so too
    when fewer than two are trainable) and no teacher taught it: the loop may set it aside
    (`loop.uniform_redraws`). Not the same as training nothing: a group whose varying
    rollouts are all masked (`trainer.truncated = "mask"`) trains nothing, yet the loop
    keeps it; a taught group of equal rewards trains on its distillation advantages."""

    @property
    def trained_tokens(self) -> int:
        return sum(r.sequence_tokens for r, t in zip(self.rollouts, self.trained, strict=True) if t)


class Workload(Protocol):
    def group(self, slot: int) -> GroupCost:
        """The group of slot `slot` (steps x tasks per step + task index) of the data order:
        the same for every mode and layout, so they are compared on the same work."""
        ...


class Parametric:
    def __init__(
        self, spec: ParametricWorkload, group_size: int, per_turn: int | None, seed: int
    ) -> None:
        self.spec = spec
        self.group_size = group_size
        """Rollouts per group: `rollout.rollouts_per_task`."""
        self.budget = None if per_turn is None else per_turn * spec.turns
        """The environment's own cap on a rollout's sampled tokens, if the config sets one."""
        self.seed = seed

    def group(self, slot: int) -> GroupCost:
        rng = random.Random(f"{self.seed}/{slot}")
        spec = self.spec
        rollouts = tuple(
            RolloutCost(
                prompt_tokens=spec.prompt_tokens,
                completion_tokens=self._tokens(rng),
                context_tokens=0,
                turns=spec.turns,
                env_s=_draw(spec.env_s, rng),
            )
            for _ in range(self.group_size)
        )
        grade_s = max(_draw(spec.grade_s, rng) for _ in rollouts)
        signal = rng.random() < spec.signal
        return GroupCost(rollouts, grade_s, (signal,) * self.group_size, uniform=not signal)

    def _tokens(self, rng: random.Random) -> int:
        tokens = round(_draw(self.spec.completion_tokens, rng))
        if self.budget is not None:
            tokens = min(tokens, self.budget)
        return max(tokens, self.spec.turns)  # a turn samples at least one token


class Recorded:
    """A run's groups: replayed in order (then drawn), or drawn at random."""

    def __init__(self, groups: list[GroupCost], replay: bool, seed: int) -> None:
        self.groups = groups
        self.replay = replay
        self.seed = seed

    def group(self, slot: int) -> GroupCost:
        if self.replay and slot < len(self.groups):
            return self.groups[slot]
        return random.Random(f"{self.seed}/{slot}").choice(self.groups)


def _draw(law: Lognormal, rng: random.Random) -> float:
    value = law.median * math.exp(law.sigma * rng.gauss()) if law.sigma else law.median
    return value if law.cap is None else min(value, law.cap)


def read_run(
    run: Path, trainer: TrainerConfig, distill: DistillConfig | None = None
) -> list[GroupCost]:
    """The groups of a run's `trajectories/step_*.jsonl`, in step order and, within a step,
    in the order the loop recorded them (for a sync run, the data order). Which rollouts
    train, and which groups are uniform, are decided as the loop decides them, under
    `trainer` and `distill`: a group a teacher taught (its rollouts carry
    `teacher_logprobs`) is never uniform."""
    files = sorted((run / "trajectories").glob("step_*.jsonl"))
    if not files:
        raise UsageError(f"no trajectories in {run} (looked for trajectories/step_*.jsonl)")
    groups: list[GroupCost] = []
    for path in files:
        for trajectories in _grouped(_trajectories(path)):
            groups.append(_cost(trajectories, trainer, distill))
    sizes = {len(g.rollouts) for g in groups}
    if len(sizes) > 1:
        raise UsageError(f"{run}: groups of several sizes ({sorted(sizes)}): not one run")
    return groups


def _trajectories(path: Path) -> list[Trajectory]:
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        return [Trajectory.model_validate_json(line) for line in lines if line.strip()]
    except ValidationError as error:
        raise UsageError(f"{path} does not hold trajectories: {error.errors()[0]['msg']}") from None


def _grouped(trajectories: list[Trajectory]) -> list[list[Trajectory]]:
    """The recorder writes each group's trajectories together."""
    groups: list[list[Trajectory]] = []
    for trajectory in trajectories:
        if groups and groups[-1][0].group_id == trajectory.group_id:
            groups[-1].append(trajectory)
        else:
            groups.append([trajectory])
    return groups


def _cost(
    trajectories: list[Trajectory], trainer: TrainerConfig, distill: DistillConfig | None
) -> GroupCost:
    rollouts = []
    for t in trajectories:
        spans = masked_spans(t.loss_mask)
        prompt = spans[0][0] if spans else len(t.token_ids)
        completion = t.completion_tokens
        rollouts.append(
            RolloutCost(
                prompt_tokens=max(prompt, 1),
                completion_tokens=max(completion, 1),
                context_tokens=len(t.token_ids) - prompt - completion,
                turns=max(len(spans), 1),
                env_s=t.timings.env_s,
            )
        )
    # the generator splits a group's grading time evenly over its scored rollouts
    scored = [t for t in trajectories if t.status in (Status.OK, Status.TRUNCATED)]
    grade_s = sum(t.timings.score_s for t in scored)
    task = Task(id=trajectories[0].group_id, prompt=[])
    group = Group(task=task, trajectories=trajectories)
    chosen = select_for_training([group], trainer, distill)
    trained = tuple(any(t is c for c in chosen.trajectories) for t in trajectories)
    # the loop sets a group aside only when no teacher teaches its task; the teacher
    # scores every trainable rollout of the tasks it teaches
    taught = distill is not None and any(t.teacher_logprobs for t in trajectories)
    uniform = not taught and not rewards_vary(group, trainer)
    return GroupCost(tuple(rollouts), grade_s, trained, uniform)
