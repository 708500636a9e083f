"""How rollouts run (concurrency, timeout, sampling), and how many a training step takes."""

from __future__ import annotations

from pydantic import Field

from reinforge.policy.config import SamplingConfig
from reinforge.types import Section


class RolloutConfig(Section):
    concurrency: int = Field(64, ge=1)
    """Rollouts in flight at once."""
    timeout_s: float = Field(600.0, gt=0.0)
    """Per rollout; a rollout past it ends with status `timeout`."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)


class TrainRolloutConfig(RolloutConfig):
    tasks_per_step: int = Field(8, ge=1)
    """Tasks per training step; each is rolled out `rollouts_per_task` times."""
    rollouts_per_task: int = Field(4, ge=1)
    """Group size: advantages are relative within a task's rollouts."""
    engines: int = Field(1, ge=1)
    """Engines the rollouts sample from. 1: one engine, in the trainer's process (or the
    `reinforge serve` at `loop.engine_url`). N > 1: the run starts N `reinforge serve`
    processes of its model and engine settings on this machine, routes each episode to the
    least-loaded one (its later turns stay there), syncs the weights to all of them each
    step, and stops them when it ends."""
    engine_restarts: int = Field(3, ge=0)
    """With `engines` > 1: how many times, all engines together, the run restarts an engine
    whose process died or stopped answering (its episodes' turns go to the other engines
    meanwhile); one more death stops the run. 0: the first death stops it."""
