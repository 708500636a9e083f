"""The training loop: rollout -> reward -> advantage -> loss -> step -> weight sync, in the
mode `loop.mode` says.

The rollout side (`RolloutSide`) and the trainer meet at a queue of finished groups. Each
step takes the first `rollout.tasks_per_step` groups to finish, drops those holding a token
older than `loop.max_staleness` versions, sets aside up to `loop.uniform_redraws` groups of
equal rewards (the next tasks take their places), trains on the rest in data order, and
syncs the weights. The modes differ only in how far ahead the rollout side may run and whether the
engine decodes while the trainer trains:

| mode    | groups outstanding          | engine while training                       |
|---------|-----------------------------|---------------------------------------------|
| sync    | one step's                  | idle: nothing is in flight                  |
| async   | (max_staleness + 1) steps'  | decodes with the weights it has             |
| partial | (max_staleness + 1) steps'  | paused; in-flight rollouts resume on the    |
|         |                             | new weights (carried over)                  |

The engine runs in this process, or as `reinforge serve` processes beside it (`engines`):
one the user started, or those the run spawns, each episode routed to one
(`orchestrate/engines.py`);
either way the trainer pushes its new weights one way to every engine
(`orchestrate/weight_sync.py`), each takes them between two of its decode steps, and every
sampled token records the version that produced it. The run's own engines are supervised:
one that dies is restarted while its episodes go on elsewhere (`orchestrate/supervisor.py`).
Recording (metrics, trajectories, checkpoints) lives in `RunRecorder`. A step where more
than `loop.max_error_rate` of the rollouts errored or timed out ends the run once it is
recorded (`TooManyErrors`): a broken environment or grader trains nothing worth having.

Ctrl-C (asyncio cancels the run's task) abandons the step in flight while it gathers
rollouts: nothing of it has reached the weights, and waiting for the slowest rollout could
take minutes. Once the step trains it runs to its end and is recorded instead, since the
optimizer step cannot be undone. Either way the last step done is checkpointed unless it
was already, and the run ends with `Interrupted`, which says which. A second Ctrl-C
exits at once (asyncio raises KeyboardInterrupt), with only the checkpoints written so far.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from transformers import PreTrainedTokenizerBase

from reinforge.config import Config
from reinforge.envs.environment import Environment
from reinforge.envs.registry import load_configured
from reinforge.errors import Interrupted, UsageError
from reinforge.orchestrate.cluster import open_cluster, open_trainer
from reinforge.orchestrate.engines import PolicyEngine, open_engine, train_and_sync
from reinforge.orchestrate.metrics import StepClock, StepMetrics, step_metrics
from reinforge.orchestrate.record import RunRecorder
from reinforge.orchestrate.rollouts import Finished, RolloutSide
from reinforge.orchestrate.supervisor import Supervisor
from reinforge.orchestrate.teachers import Teachers
from reinforge.orchestrate.trackers import check_installed
from reinforge.orchestrate.weight_sync import Synced
from reinforge.policy.models import load_tokenizer
from reinforge.rollout.summary import check_errors, summarize
from reinforge.train.checkpoints import load_progress, resume_from
from reinforge.train.trainer import (
    PolicyTrainer,
    Selection,
    TrainStats,
    rewards_vary,
    select_for_training,
)
from reinforge.types import Group

T = TypeVar("T")


async def train(
    config: Config,
    on_step: Callable[[StepMetrics], None],
    resume: bool = False,
    overwrite: bool = False,
) -> Path:
    """Run `config.run.steps` steps, or with `resume` what is left of them after the last
    checkpoint (all of them when there is none); `overwrite`: start over in a directory
    that holds a run. Returns the run directory. Raises `TooManyErrors` after recording a
    step past `loop.max_error_rate`, and `Interrupted` when cancelled (Ctrl-C)."""
    check_installed(config.run)
    env = load_configured(config.env)
    start = _Start.of(config, resume)
    tokenizer = load_tokenizer(config.model.name)
    async with AsyncExitStack() as closing:  # whatever happens, in reverse order
        closing.push_async_callback(env.aclose)
        run = await _Run.open(config, env, tokenizer, start, overwrite, closing)
        per_step = config.rollout.tasks_per_step
        clock, finishing = StepClock(run.engine.model_stats()), _Finishing()
        try:
            for step in range(start.step + 1, config.run.steps + 1):
                # 1. rollout: the first groups to finish, none staler than the bound
                with clock.part("trainer_idle_s"):
                    collected = await run.collect(per_step)
                # 2. reward is in the trajectories; a teacher (distillation) scores the
                # tokens of the tasks it teaches
                with clock.part("teacher_s"):
                    groups = await run.teachers.score(collected.groups)
                # 3. advantages within each group, per token where a teacher scored it
                selection = select_for_training(
                    groups, config.trainer, config.distill, collected.redrawn
                )
                # 4-6. loss, optimizer step, weight sync to every engine (nothing to learn
                # if every group was uniform); in a thread, so the rollout side keeps
                # running. From here on the step finishes, Ctrl-C or not.
                trained_version = run.engine.version
                with clock.part("train_s"):
                    trained, synced = await finishing.run(run.train(selection))
                    await finishing.run(run.rollouts.release(per_step))
                # 7. record: metrics, trajectories, a checkpoint when due
                metrics = run.metrics(
                    step, clock, collected, groups, selection, trained, trained_version, synced
                )
                run.recorder.record(step, metrics, run.trainer, run.state(), groups)
                on_step(metrics)
                check_errors(
                    metrics, config.loop.max_error_rate, "loop.max_error_rate",
                    f"rollouts of step {step}",
                )  # fmt: skip
                if finishing.interrupted:
                    saved = run.recorder.save_last(run.trainer)
                    raise Interrupted(f"step {step} finished, as it was training; {saved}")
        except asyncio.CancelledError:
            saved = run.recorder.save_last(run.trainer)
            raise Interrupted(
                f"step {run.recorder.steps + 1} abandoned, its rollouts discarded; {saved}"
            ) from None
    return run.recorder.directory


@dataclass(frozen=True)
class _Start:
    """Where a run starts: its steps done, policy version and rollout position, from the
    last checkpoint when it resumes."""

    resume: bool
    """Asked for: a run that has no checkpoint yet resumes from step 0."""
    step: int
    version: int
    position: dict[str, Any]
    checkpoint: Path | None

    @classmethod
    def of(cls, config: Config, resume: bool) -> _Start:
        checkpoint = resume_from(config.run_dir) if resume else None
        if checkpoint is None:
            return cls(resume, 0, 0, RolloutSide.start_position(0), None)
        state = load_progress(checkpoint)
        step = state["step"]
        if step >= config.run.steps:
            raise UsageError(
                f"{config.run_dir} has finished its {step} steps: nothing to resume "
                f"(raise run.steps to train on)"
            )
        position = state.get("loop", RolloutSide.start_position(step))
        return cls(resume, step, state["policy_version"], position, checkpoint)


@dataclass(frozen=True)
class _Collected:
    """Step 1's outcome: the groups to train on, after those set aside as uniform."""

    groups: list[Group]
    redrawn: int
    dropped: int
    """Finished beyond the staleness bound."""


@dataclass
class _Run:
    """The parts of a run, open, and what the loop asks of them at each step."""

    config: Config
    env: Environment
    recorder: RunRecorder
    teachers: Teachers
    trainer: PolicyTrainer
    engine: PolicyEngine
    supervisor: Supervisor
    watching: asyncio.Task[None]
    rollouts: RolloutSide

    @classmethod
    async def open(
        cls,
        config: Config,
        env: Environment,
        tokenizer: PreTrainedTokenizerBase,
        start: _Start,
        overwrite: bool,
        closing: AsyncExitStack,
    ) -> _Run:
        """Everything a run needs, each closed by `closing` in reverse order."""
        # first: a directory holding another run is refused before anything loads
        recorder = closing.enter_context(
            RunRecorder(config, tokenizer, start.step, start.resume, overwrite)
        )
        teachers = await Teachers.open(config, tokenizer, env.name)
        closing.push_async_callback(teachers.aclose)
        cluster = closing.enter_context(open_cluster(config))
        budget = config.trainer.for_budget(env.harness.max_sampled_tokens)
        trainer = open_trainer(config, budget, cluster, start.checkpoint)
        closing.callback(trainer.close)
        engine = await open_engine(config, trainer, tokenizer, start.version, cluster.engines)
        closing.push_async_callback(engine.aclose)
        supervisor = Supervisor(engine, config.engines)
        watching = asyncio.create_task(supervisor.watch())
        closing.push_async_callback(_stop, watching)
        outstanding = (config.loop.staleness_bound + 1) * config.rollout.tasks_per_step
        rollouts = RolloutSide(
            env, engine.router, config.rollout, config.run.seed, outstanding, start.position
        )
        closing.push_async_callback(rollouts.aclose)
        producer = asyncio.create_task(rollouts.run())
        closing.push_async_callback(_stop, producer)
        return cls(config, env, recorder, teachers, trainer, engine, supervisor, watching, rollouts)

    async def collect(self, needed: int) -> _Collected:
        """The first `needed` groups to finish within the staleness bound, after up to
        `loop.uniform_redraws` uniform ones that finished earlier (returned with them, set
        aside: not counted among the `needed`). Groups beyond the bound are dropped. Both
        kinds give their slots back to the rollout side at once, so the next tasks start
        in their places. Should the engines' supervisor give up first, its error."""
        loop = self.config.loop
        version = self.engine.version
        kept: list[Finished] = []
        redrawn = dropped = 0
        while len(kept) < needed + redrawn:
            next_group = asyncio.ensure_future(self.rollouts.next_group())
            await asyncio.wait({next_group, self.watching}, return_when=asyncio.FIRST_COMPLETED)
            if self.watching.done():
                next_group.cancel()
                self.watching.result()  # raises: it never ends otherwise
            finished = next_group.result()
            oldest = finished.oldest_version
            if oldest is not None and version - oldest > loop.staleness_bound:
                dropped += 1
                await self.rollouts.release(1)
                continue
            kept.append(finished)
            if redrawn < loop.uniform_redraws and self._trains_nothing(finished.group):
                redrawn += 1
                await self.rollouts.release(1)
        groups = [f.group for f in sorted(kept, key=lambda f: f.slot)]
        return _Collected(groups, redrawn, dropped)

    def _trains_nothing(self, group: Group) -> bool:
        """Equal rewards and no teacher: every advantage would be 0."""
        return self.teachers.teacher_of(group.task) is None and not rewards_vary(
            group, self.config.trainer
        )

    async def train(self, selection: Selection) -> tuple[TrainStats | None, Synced | None]:
        """Train on the selection and push the weights, in a thread; nothing when every
        group was uniform."""
        if not selection.trajectories:
            return None, None
        batch = selection.batch()
        return await asyncio.to_thread(train_and_sync, self.engine, self.trainer, batch)

    def metrics(
        self,
        step: int,
        clock: StepClock,
        collected: _Collected,
        groups: list[Group],
        selection: Selection,
        trained: TrainStats | None,
        trained_version: int,
        synced: Synced | None,
    ) -> StepMetrics:
        time = clock.lap(
            sync_s=0.0 if synced is None else synced.seconds,
            rollout_idle_s=self.rollouts.take_idle_s(),
        )
        busy_s = time.total_s - time.rollout_idle_s
        sampled = sum(t.completion_tokens for g in groups for t in g.trajectories)
        return step_metrics(
            step,
            summarize(groups, self.env.rubric.pass_threshold),
            selection,
            trained,
            trained_version=trained_version,
            policy_version=self.engine.version,
            dropped_stale=collected.dropped,
            redrawn=collected.redrawn,
            time=time,
            rollout_tokens_per_s=sampled / busy_s if busy_s > 0 else 0.0,
            synced=synced,
            traffic=self.engine.router.take_traffic(),
            restarts=self.supervisor.take_restarts(),
            teacher_s=clock.took("teacher_s") if self.config.distill else None,
            model=clock.model,
        )

    def state(self) -> dict[str, Any]:
        """The loop's entries of a checkpoint's trainer state."""
        return {"policy_version": self.engine.version, "loop": self.rollouts.position()}


class _Finishing:
    """Awaits that Ctrl-C must not cut short: a step's training runs in a thread that
    cannot be stopped, and a step trained but not recorded would leave the weights ahead
    of the record. An interruption meanwhile is noted, for the loop to act on once the
    step is recorded."""

    def __init__(self) -> None:
        self.interrupted = False

    async def run(self, work: Awaitable[T]) -> T:
        task = asyncio.ensure_future(work)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            self.interrupted = True
            return await task


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
