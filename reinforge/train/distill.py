"""On-policy distillation: the student samples, a teacher scores the student's own tokens,
and each sampled token's advantage is the negative reverse KL between them.

The config says which teachers teach which tasks and how the distillation advantage
joins the RL reward's; `distill_advantages` is the arithmetic, pinned by
`test_distill_advantages_of_a_hand_made_three_token_example`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from reinforge.types import Section, Trajectory

if TYPE_CHECKING:
    from torch import Tensor


class TeacherConfig(Section):
    model: str
    """A model spec the engine loads (smollm2-135m, tiny-random, a checkpoint folder), or
    the /v1 URL of an OpenAI-compatible server that returns prompt log-probs (completions
    with echo, logprobs and max_tokens 0, as `reinforge serve` and vLLM do). It must share
    the student's tokenizer."""
    served_name: str | None = None
    """With a URL: the model to ask for there; None: the first the server lists."""
    route: str | None = None
    """The tasks it teaches: those of the environment of this name, or with this tag in
    their `info["tags"]`; None: every task. The first teacher that matches a task teaches
    it; a task none matches trains on its reward alone."""


class DistillConfig(Section):
    """Per sampled token t of a taught task, advantage = reward_weight x (the group-relative
    advantage of the reward) + coef x (teacher log-prob of t - student log-prob of t)."""

    teachers: list[TeacherConfig] = Field(min_length=1)
    """One or more teachers, each for the tasks its route names (several experts distilled
    onto one student)."""
    coef: float = Field(1.0, gt=0.0)
    """Weight of the negative reverse KL, per token."""
    reward_weight: float = Field(0.0, ge=0.0)
    """Weight of the reward's group-relative advantage on taught tasks; 0: pure
    distillation, the reward plays no part (groups of equal rewards train too)."""

    def token_advantages(self, trajectory: Trajectory, rl_advantage: float) -> list[float]:
        """One advantage per sampled token of a taught trajectory."""
        import torch  # here, not above: the config loads before a command needs torch

        return distill_advantages(
            torch.tensor(trajectory.teacher_logprobs),
            torch.tensor(trajectory.logprobs),
            rl_advantage,
            coef=self.coef,
            reward_weight=self.reward_weight,
        ).tolist()


def distill_advantages(
    teacher_logp: Tensor,
    behaviour_logp: Tensor,
    rl_advantage: float,
    *,
    coef: float,
    reward_weight: float,
) -> Tensor:
    """`reward_weight * rl_advantage + coef * (teacher_logp - behaviour_logp)` per token.

    On-policy distillation (Agarwal et al. 2024, GKD; "On-Policy Distillation", Lu and
    Thinking Machines Lab 2025): the per-token reverse KL estimate log pi_student(t) -
    log pi_teacher(t) on the student's own sample t, negated, is the advantage, with no
    discounting over later tokens (Thinking Machines' choice), so the policy-gradient loss
    pushes each token towards what the teacher would have said there. The student's
    log-prob is the behaviour one the engine recorded while sampling (the student's own at
    temperature 1 and top_p 1). Departs from the pure recipe in adding the reward's
    group-relative advantage, spread over every token, when `reward_weight` > 0.

    teacher_logp, behaviour_logp: (S,), one per sampled token. Returns (S,).
    """
    if teacher_logp.shape != behaviour_logp.shape:
        raise ValueError(
            f"{teacher_logp.shape[0]} teacher log-probs for {behaviour_logp.shape[0]} "
            "sampled tokens: they must be one per sampled token"
        )
    return reward_weight * rl_advantage + coef * (teacher_logp - behaviour_logp)  # (S,)
