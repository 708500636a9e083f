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
