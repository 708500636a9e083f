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

The engine runs in this process, or as `reinforge serve` processes beside it, one or
`rollout.engines` of them with each episode routed to one (`orchestrate/engines.py`);
either way a weight sync reaches every engine between two of its decode steps, and every
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
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TypeVar

from reinforge.config import Config
from reinforge.envs.registry import load_configured
from reinforge.errors import Interrupted, UsageError
from reinforge.orchestrate.cluster import open_cluster, open_trainer
from reinforge.orchestrate.engines import open_engine
from reinforge.orchestrate.metrics import StepMetrics, StepTime, step_metrics
from reinforge.orchestrate.record import RunRecorder
from reinforge.orchestrate.rollouts import Finished, RolloutSide
from reinforge.orchestrate.supervisor import Supervisor
from reinforge.orchestrate.teachers import Teachers
from reinforge.orchestrate.trackers import check_installed
from reinforge.policy.models import load_tokenizer
from reinforge.rollout.summary import check_errors, summarize
from reinforge.train.checkpoints import load_progress, resume_from
from reinforge.train.trainer import rewards_vary, select_for_training
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
    checkpoint = resume_from(config.run_dir) if resume else None
    tokenizer = load_tokenizer(config.model.name)
    start_step, version = 0, 0
    position = RolloutSide.start_position(0)
    if checkpoint is not None:
        state = load_progress(checkpoint)
        start_step, version = state["step"], state["policy_version"]
        if start_step >= config.run.steps:
            raise UsageError(
                f"{config.run_dir} has finished its {start_step} steps: nothing to resume "
                f"(raise run.steps to train on)"
            )
        position = state.get("loop", RolloutSide.start_position(start_step))
    async with AsyncExitStack() as closing:  # whatever happens, in reverse order
        closing.push_async_callback(env.aclose)
        # first: a directory holding another run is refused before anything loads
        recorder = closing.enter_context(
            RunRecorder(config, tokenizer, start_step, resume, overwrite)
        )
        teachers = await Teachers.open(config, tokenizer, env.name)
        closing.push_async_callback(teachers.aclose)
        cluster = closing.enter_context(open_cluster(config))
        budget = config.trainer.for_budget(env.harness.max_sampled_tokens)
        trainer = open_trainer(config, budget, cluster, checkpoint)
        closing.callback(trainer.close)
        engine = await open_engine(config, trainer, tokenizer, version, cluster.engines)
        closing.push_async_callback(engine.aclose)
        supervisor = Supervisor(engine, config.rollout.engine_restarts)
        watching = asyncio.create_task(supervisor.watch())
        closing.push_async_callback(_stop, watching)
        bound = config.loop.max_staleness if config.loop.mode != "sync" else 0
        per_step = config.rollout.tasks_per_step
        rollouts = RolloutSide(
            env, engine.router, config.rollout, config.run.seed, (bound + 1) * per_step, position
        )
        closing.push_async_callback(rollouts.aclose)
        producer = asyncio.create_task(rollouts.run())
        closing.push_async_callback(_stop, producer)
        last_step_end = time.perf_counter()
        finishing = _Finishing()
        try:
            for step in range(start_step, config.run.steps):
                # 1. rollout: the first groups to finish, none staler than the bound
                started = time.perf_counter()
                finished, redrawn, dropped = await _collect(
                    rollouts,
                    watching,
                    per_step,
                    engine.version,
                    bound,
                    config.loop.uniform_redraws,
                    lambda group: (
                        teachers.teacher_of(group.task) is None
                        and not rewards_vary(group, config.trainer)
                    ),
                )
                trainer_idle_s = time.perf_counter() - started
                groups = [f.group for f in sorted(finished, key=lambda f: f.slot)]
                # 2. reward is in the trajectories; a teacher (distillation) scores the tokens
                # of the tasks it teaches
                started = time.perf_counter()
                groups = await teachers.score(groups)
                teacher_s = time.perf_counter() - started
                # 3. advantages within each group, per token where a teacher scored it
                selection = select_for_training(groups, config.trainer, config.distill, redrawn)
                trained_version = engine.version
                # 4-6. loss, optimizer step, weight sync to every engine (nothing to learn if
                # every group was uniform); in a thread, so the rollout side keeps running.
                # From here on the step finishes, Ctrl-C or not.
                started = time.perf_counter()
                trained, synced = None, None
                if selection.trajectories:
                    trained, synced = await finishing.run(
                        asyncio.to_thread(engine.train_step, trainer, selection.batch())
                    )
                sync_s = 0.0 if synced is None else synced.seconds
                train_s = time.perf_counter() - started - sync_s
                await finishing.run(rollouts.release(per_step))
                now = time.perf_counter()
                total_s, last_step_end = now - last_step_end, now
                rollout_idle_s = rollouts.take_idle_s()
                sampled = sum(t.completion_tokens for g in groups for t in g.trajectories)
                busy_s = total_s - rollout_idle_s
                metrics = step_metrics(
                    step + 1,
                    summarize(groups, env.rubric.pass_threshold),
                    selection,
                    trained,
                    trained_version=trained_version,
                    policy_version=engine.version,
                    dropped_stale=dropped,
                    redrawn=redrawn,
                    time=StepTime(
                        trainer_idle_s=trainer_idle_s,
                        train_s=train_s,
                        sync_s=sync_s,
                        rollout_idle_s=rollout_idle_s,
                        total_s=total_s,
                    ),
                    rollout_tokens_per_s=sampled / busy_s if busy_s > 0 else 0.0,
                    synced=synced,
                    traffic=engine.router.take_traffic(),
                    restarts=supervisor.take_restarts(),
                    teacher_s=teacher_s if config.distill else None,
                )
                state = {"policy_version": engine.version, "loop": rollouts.position()}
                recorder.record(step + 1, metrics, trainer, state, groups)
                on_step(metrics)
                check_errors(
                    metrics,
                    config.loop.max_error_rate,
                    "loop.max_error_rate",
                    f"rollouts of step {step + 1}",
                )
                if finishing.interrupted:
                    saved = recorder.save_last(trainer)
                    raise Interrupted(f"step {step + 1} finished, as it was training; {saved}")
        except asyncio.CancelledError:
            saved = recorder.save_last(trainer)
            raise Interrupted(
                f"step {recorder.steps + 1} abandoned, its rollouts discarded; {saved}"
            ) from None
    return recorder.directory


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


async def _collect(
    rollouts: RolloutSide,
    watching: asyncio.Task[None],
    needed: int,
    version: int,
    max_staleness: int,
    redraws: int,
    uniform: Callable[[Group], bool],
) -> tuple[list[Finished], int, int]:
    """The first `needed` groups to finish within the staleness bound, after up to
    `redraws` `uniform` ones that finished earlier (returned with them, set aside: not
    counted among the `needed`); how many of those were set aside, and how many finished
    beyond the bound (dropped). Both kinds give their slots back to the rollout side at
    once, so the next tasks start in their places. Should the engines' supervisor give up
    (`watching` ends) first, its error."""
    kept: list[Finished] = []
    redrawn = dropped = 0
    while len(kept) < needed + redrawn:
        next_group = asyncio.ensure_future(rollouts.next_group())
        await asyncio.wait({next_group, watching}, return_when=asyncio.FIRST_COMPLETED)
        if watching.done():
            next_group.cancel()
            watching.result()  # raises: it never ends otherwise
        finished = next_group.result()
        oldest = finished.oldest_version
        if oldest is not None and version - oldest > max_staleness:
            dropped += 1
            await rollouts.release(1)
            continue
        kept.append(finished)
        if redrawn < redraws and uniform(finished.group):
            redrawn += 1
            await rollouts.release(1)
    return kept, redrawn, dropped
