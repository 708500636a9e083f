"""How far a Harbor episode's grading got: a typed record that the environment keeps on the
episode (`Episode.extras`) and the rubric's `reward` term reads back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Grading:
    """One episode's grading. Its fields join the episode's state, and so its trajectory's
    info, under their own names once the episode stops (`info`); a field left unset is
    left out."""

    agent_timed_out: bool = False
    """The agent phase ran out of `[agent] timeout_sec`; grading goes on."""
    agent_done: bool = False
    """The agent phase completed, in time or not: only then is its workspace graded."""
    hack_flags: list[str] | None = None
    """What the agent's tool calls tried that no honest solution needs: labels, never a
    reward term."""
    reward: float | None = None
    """The verifier's reward, or 0 where the agent's own doing stopped its grading."""
    verifier_rewards: dict[str, float] | None = None
    verifier_exit_code: int | None = None
    verifier_output: str | None = None
    """The end of what the verifier printed."""
    verifier_error: str | None = None
    """Why the verifier gave no reward: the rollout is an error, never a silent 0."""
    verifier_fault: str | None = None
    """What the agent did that stopped its grading: the reason for its 0."""

    def info(self) -> dict[str, Any]:
        """The fields that were set, by name, in the order above."""
        return {
            name: value
            for name, value in vars(self).items()
            if value is not None and value is not False
        }
