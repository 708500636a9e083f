"""How rollouts run (concurrency, timeout, sampling), and how many a training step takes."""

from __future__ import annotations

from pydantic import Field

from reinforge.policy.config import SamplingConfig
from reinforge.types import Section


class RolloutConfig(Section):
    concurrency: int = Field(64, ge=1)
    """Rollouts in flight at once."""
    timeout_s: float = Field(600.0, gt=0.0)
    """Per rollout, and again for the grading of its group; a rollout past it ends with
    status `timeout`, a grading past it makes its group's rollouts errors. Sync user code
    (tools, rewards, `setup`, `is_done`) runs in threads, so a hang in it times out too; a
    thread that never returns is abandoned, and the run goes on."""
    max_block_s: float = Field(30.0, gt=0.0)
    """How long a rollout's (or its grading's) async code may hold the event loop in one go,
    as `time.sleep` in an `async def` or a long computation does; past it the rollout (or
    the group's grading) fails with an error naming the line. Every other rollout, and an
    engine in this process, waits meanwhile, and no timeout fires."""
    max_message_bytes: int = Field(65536, ge=1)
    """The most bytes of text one tool result or environment message (`Continue`) adds to
    the conversation; the rest is cut, with a note in the message saying at how many bytes.
    Keep it well under the policy server's `server.max_request_bytes`."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)


class TrainRolloutConfig(RolloutConfig):
    tasks_per_step: int = Field(8, ge=1)
    """Tasks per training step; each is rolled out `rollouts_per_task` times."""
    rollouts_per_task: int = Field(4, ge=1)
    """Group size: advantages are relative within a task's rollouts."""
