"""A line of metrics.jsonl: what a step did, as one typed record.

An RL step's line starts with the `RolloutSummary` of its groups, the numbers `reinforge
eval` reports under the same names, then what the trainer did with them (`train`, null
when every group was uniform), the policy versions and staleness, where the time went,
what the weight sync moved, and each engine's load.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from reinforge.orchestrate.weight_sync import Synced
from reinforge.policy.client import Traffic
from reinforge.policy.engine_thread import EngineStats
from reinforge.rollout.summary import RolloutSummary
from reinforge.train.trainer import Selection, TrainStats
from reinforge.types import Record


class StepTime(Record):
    """A step's wall time, split. The trainer's parts (`trainer_idle_s`, `train_s`,
    `sync_s`) lie within `total_s`; the rest of it is recording. `rollout_idle_s` is the
    rollout side's and overlaps them."""

    trainer_idle_s: float
    """Waiting for the step's groups to finish."""
    train_s: float
    """Forward, backward and optimizer step."""
    sync_s: float
    """Getting the new weights to every engine."""
    rollout_idle_s: float
    """The rollout side with nothing to sample (at its staleness bound, or paused)."""
    total_s: float
    """From the end of the previous step to the end of this one."""


class ModelTime(Record):
    """The built-in engine in this process during the step: its prompts' forwards (with
    their first tokens' sampling), its decode steps (with their sampling and retiring the
    rows that finished), all its time holding the model (recomputing states after a weight
    update too), and the rest of the step, when it computed nothing: the rollouts were
    waiting on tools, sandboxes or graders, or the step on the trainer."""

    prefill_s: float
    decode_s: float
    busy_s: float
    idle_s: float


def _model_parts(stats: EngineStats | None) -> tuple[float, float, float]:
    return (0.0, 0.0, 0.0) if stats is None else (stats.prefill_s, stats.decode_s, stats.busy_s)


class StepClock:
    """A step's wall time, taken as the loop runs it: each of its parts is timed with
    `part`, and `lap` ends the step, splitting its time into a `StepTime`."""

    def __init__(self, model: EngineStats | None = None) -> None:
        self._last_end = time.perf_counter()
        self._parts: dict[str, float] = {}
        self._model, self._model_last = model, _model_parts(model)
        self.model: ModelTime | None = None
        """The share of the step `lap` ended last that `model`, the running stats of a
        built-in engine in this process, spent; None without one."""

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time the body as the step's `name` (a `StepTime` field, or `teacher_s`)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self._parts[name] = time.perf_counter() - started

    def took(self, name: str) -> float:
        return self._parts.get(name, 0.0)

    def lap(self, sync_s: float, rollout_idle_s: float) -> StepTime:
        """The step's time, ended now; the next step's starts. `sync_s` was spent within
        `train_s`'s part, and is taken out of it."""
        now = time.perf_counter()
        total_s, self._last_end = now - self._last_end, now
        self.model = self._model_lap(total_s)
        return StepTime(
            trainer_idle_s=self.took("trainer_idle_s"),
            train_s=self.took("train_s") - sync_s,
            sync_s=sync_s,
            rollout_idle_s=rollout_idle_s,
            total_s=total_s,
        )

    def _model_lap(self, total_s: float) -> ModelTime | None:
        if self._model is None:
            return None
        now = _model_parts(self._model)
        prefill_s, decode_s, busy_s = (a - b for a, b in zip(now, self._model_last, strict=True))
        self._model_last = now
        return ModelTime(
            prefill_s=prefill_s, decode_s=decode_s, busy_s=busy_s, idle_s=max(total_s - busy_s, 0)
        )


class TokenRates(Record):
    rollout: float
    """Sampled tokens per second of the rollout side's busy time."""
    train: float
    """Trained tokens per second of `train_s`."""


class SyncStats(Record):
    """The step's weight sync, beside its seconds (`time.sync_s`)."""

    engines: int
    """Engines that took the new weights."""
    bytes: int
    """What the engines that took the weights were sent, summed over them: the weights'
    size each, or with `engines.weight_sync.delta` (object store) the changed elements of
    each bucket an engine could build from them; 0 when the engine shares the trainer's weights
    (the optimizer step is the sync)."""
    bytes_per_s: float
    """`bytes` over `time.sync_s`: what the sync moved per second of it."""
    write_s: float
    """The trainer writing the weights once for every engine (the file handoff); the rest
    of `time.sync_s` is the engines loading them, at once."""


class EngineLoad(Record):
    """One engine's share of the step's sampling, as its router saw it."""

    requests: int
    """Requests it answered during the step."""
    sampled_tokens: int
    tokens_per_s: float
    """`sampled_tokens` over the step's `time.total_s`."""
    in_flight: int
    """Requests it held when the step ended: its queue depth."""


class DistillStats(Record):
    """On-policy distillation's numbers, over the step's trained tokens that a teacher
    scored."""

    reverse_kl: float
    """Mean of the student's log-prob (the behaviour one) minus the teacher's: an
    estimate of KL(student || teacher) per token, about 0 when the two agree."""
    taught_samples: int
    """Trained rollouts a teacher scored."""
    taught_tokens: int
    teacher_s: float
    """Seconds the teachers took to score the step's rollouts."""


class StepMetrics(RolloutSummary):
    step: int
    """Counted from 1: the steps done after it."""
    zero_variance_groups: int
    """Groups whose rewards were all equal: no signal, not trained."""
    redrawn: int = 0
    """Of those, the ones set aside with the next tasks drawn in their place
    (`loop.uniform_redraws`)."""
    masked_truncated: int
    """Truncated completions left out of the loss (`trainer.truncated = "mask"`)."""
    train: TrainStats | None
    """None when nothing trained (every group uniform)."""
    policy_version: int
    """The engine's version after this step's weight sync."""
    trained_samples: int
    samples_per_min: float
    """Trained samples per minute of `time.total_s`."""
    staleness_max: int
    """Trainer version minus the version that sampled a trained token, at most."""
    staleness_mean: float
    dropped_stale: int
    """Groups that finished beyond `loop.max_staleness`: never trained."""
    carried_over: int
    """Trained rollouts sampled under two or more policy versions (partial mode)."""
    time: StepTime
    tokens_per_s: TokenRates
    sync: SyncStats | None
    """None when nothing trained (nothing to sync)."""
    engines: list[EngineLoad]
    """In engine order (the `engine-<i>.log` of the run's own engines)."""
    model: ModelTime | None = None
    """None when the engines run in other processes, or are vLLM."""
    restarts: int = 0
    """The run's engines restarted during the step, after their process died or stopped
    answering (`engines.restarts` bounds them over the run)."""
    distill: DistillStats | None = None
    """None when the run does not distil (`distill` unset)."""


class SftStepMetrics(Record):
    step: int
    epoch: int
    """Counted from 0."""
    sequences: int
    train: TrainStats
    time_s: float
    tokens_per_s: float
    """Trained tokens per second of `time_s`."""


def step_metrics(
    step: int,
    summary: RolloutSummary,
    selection: Selection,
    trained: TrainStats | None,
    *,
    trained_version: int,
    policy_version: int,
    dropped_stale: int,
    redrawn: int = 0,
    time: StepTime,
    rollout_tokens_per_s: float,
    synced: Synced | None,
    traffic: list[Traffic],
    restarts: int = 0,
    teacher_s: float | None = None,
    model: ModelTime | None = None,
) -> StepMetrics:
    """`summary` is `summarize` of the step's groups; staleness is the trainer's version
    when it trained (`trained_version`) minus the version that sampled each trained token.
    `synced`: the weight sync, None when nothing trained; `traffic`: each engine's requests
    and tokens during the step; `restarts`: engines restarted during it. `teacher_s`: the
    teachers' scoring time, when the run distils."""
    staleness = [trained_version - v for t in selection.trajectories for v in t.policy_versions]
    samples = len(selection.trajectories)
    trained_tokens = trained.trained_tokens if trained is not None else 0.0
    return StepMetrics(
        **dict(summary),
        step=step,
        zero_variance_groups=selection.zero_variance_groups,
        redrawn=redrawn,
        masked_truncated=selection.masked_truncated,
        train=trained,
        policy_version=policy_version,
        trained_samples=samples,
        samples_per_min=60 * samples / time.total_s if time.total_s > 0 else 0.0,
        staleness_max=max(staleness, default=0),
        staleness_mean=sum(staleness) / len(staleness) if staleness else 0.0,
        dropped_stale=dropped_stale,
        carried_over=sum(len(set(t.policy_versions)) > 1 for t in selection.trajectories),
        time=time,
        tokens_per_s=TokenRates(
            rollout=rollout_tokens_per_s,
            train=trained_tokens / time.train_s if time.train_s > 0 else 0.0,
        ),
        sync=None if synced is None else _sync_stats(synced),
        engines=[
            EngineLoad(
                requests=t.requests,
                sampled_tokens=t.sampled_tokens,
                tokens_per_s=t.sampled_tokens / time.total_s if time.total_s > 0 else 0.0,
                in_flight=t.in_flight,
            )
            for t in traffic
        ],
        restarts=restarts,
        distill=None if teacher_s is None else _distill_stats(selection, teacher_s),
        model=model,
    )


def _sync_stats(synced: Synced) -> SyncStats:
    return SyncStats(
        engines=synced.engines,
        bytes=synced.bytes,
        bytes_per_s=synced.bytes / synced.seconds if synced.seconds > 0 else 0.0,
        write_s=synced.write_s,
    )


def _distill_stats(selection: Selection, teacher_s: float) -> DistillStats:
    taught = [t for t in selection.trajectories if t.teacher_logprobs]
    gaps = [s - t for r in taught for s, t in zip(r.logprobs, r.teacher_logprobs, strict=True)]
    return DistillStats(
        reverse_kl=sum(gaps) / len(gaps) if gaps else 0.0,
        taught_samples=len(taught),
        taught_tokens=len(gaps),
        teacher_s=teacher_s,
    )
