"""The RL algorithm as config: which advantage, loss, aggregation and off-policy
correction to use, and what becomes of a truncated completion.

Each variant is a small pydantic model tagged by `kind` that applies itself, so
the trainer calls `config.advantage.compute(rewards)` and `config.loss.batch_loss(...)` and
never branches on a name. Unknown keys and unknown kinds are rejected when the config is loaded.
How each token weighs (the aggregation and the off-policy correction) is in `token_weights`.

A command loads its config before anything heavy, so that a typo is answered at once: the
methods import the arithmetic (`losses`, which needs torch) when they first run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BeforeValidator, Field, Tag

from reinforge.train.advantages import dr_grpo_advantages, grpo_advantages
from reinforge.train.token_weights import (
    AggregationConfig,
    CorrectionConfig,
    NoCorrection,
    TokenMean,
    Variant,
)
from reinforge.types import Status, by_kind, tagged

if TYPE_CHECKING:
    from torch import Tensor

    from reinforge.train.batching import TrainBatch
    from reinforge.train.losses import LikelihoodMetrics, PolicyMetrics
    from reinforge.types import Trajectory


# ---- advantages -------------------------------------------------------------------------


class GRPOAdvantage(Variant):
    """(r - mean) / (sample std + eps) within the group; see `grpo_advantages`."""

    kind: Literal["grpo"] = "grpo"
    eps: float = Field(1e-4, gt=0.0)
    """Added to the std so a group of equal rewards divides 0 by eps, not by 0. TRL's value."""

    def compute(self, rewards: Tensor) -> Tensor:
        """rewards: (G,) one group, or (N, G) equal-size groups. Same shape back."""
        return grpo_advantages(rewards, self.eps)


class DrGRPOAdvantage(Variant):
    """r - mean within the group, no std; see `dr_grpo_advantages`."""

    kind: Literal["dr_grpo"] = "dr_grpo"

    def compute(self, rewards: Tensor) -> Tensor:
        """rewards: (G,) one group, or (N, G) equal-size groups. Same shape back."""
        return dr_grpo_advantages(rewards)


AdvantageConfig = Annotated[
    Annotated[GRPOAdvantage, Tag("grpo")] | Annotated[DrGRPOAdvantage, Tag("dr_grpo")],
    tagged("kind", "grpo"),
]


# ---- truncated completions --------------------------------------------------------------


class _Truncation(Variant):
    """What becomes of a completion cut off by a token or turn limit, or stopped in a loop
    (`rollout.sampling.stop_loops`)."""

    def training_reward(self, trajectory: Trajectory) -> float:
        """The reward the advantage sees."""
        assert trajectory.reward is not None  # ok or truncated: scored
        return trajectory.reward

    def trains(self, trajectory: Trajectory) -> bool:
        """Whether it joins the loss; it shapes its group's baseline either way."""
        return True


class Keep(_Truncation):
    """Train on it with its reward."""

    kind: Literal["keep"] = "keep"


class Mask(_Truncation):
    """Leave it out of the loss; it still counts in its group's baseline (DAPO's overlong
    filtering)."""

    kind: Literal["mask"] = "mask"

    def trains(self, trajectory: Trajectory) -> bool:
        return trajectory.status is not Status.TRUNCATED


class Penalize(_Truncation):
    """Its reward becomes `reward`."""

    kind: Literal["penalize"] = "penalize"
    reward: float = 0.0
    """The reward of a truncated completion, in place of the rubric's."""

    def training_reward(self, trajectory: Trajectory) -> float:
        if trajectory.status is Status.TRUNCATED:
            return self.reward
        return super().training_reward(trajectory)


TruncatedConfig = Annotated[
    Annotated[Keep, Tag("keep")]
    | Annotated[Mask, Tag("mask")]
    | Annotated[Penalize, Tag("penalize")],
    tagged("kind", "keep"),
    BeforeValidator(by_kind),
]


# ---- losses -----------------------------------------------------------------------------


class _Loss(Variant, ABC):
    @property
    def needs_reference(self) -> bool:
        """Whether `batch_loss` needs the reference model's log-probs."""
        return False

    @abstractmethod
    def batch_loss(
        self,
        logp: Tensor,
        batch: TrainBatch,
        *,
        weights: Tensor,
        ref_logp: Tensor | None = None,
        proximal_logp: Tensor | None = None,
    ) -> tuple[Tensor, PolicyMetrics | LikelihoodMetrics]:
        """The trainer's one call: the scalar loss of a micro-batch and metrics, each loss
        reading from `batch` only the fields it needs, so one trainer steps every loss.

        logp: (b, t), the trainer's log-probs of `batch.targets`, with gradient. weights:
        (b, t), this micro-batch's rows of `aggregation.weights(whole batch mask)`.
        ref_logp: (b, t), the reference model's, when `needs_reference`. proximal_logp:
        (b, t) detached, the trainer's before the batch's first update; None: `logp`'s.
        """


class PPOClipLoss(_Loss):
    """Clipped surrogate, plus an optional k3 KL penalty; see `ppo_clip_loss`.

    Per token: `ppo_clip_loss(...) + kl_coef * kl_k3(...)`, then aggregated. `correction`
    chooses the surrogate's anchor and per-token weights: by default the ratio is against
    the behaviour policy (the sampler's log-probs); "tis" and "mis" anchor it on the
    trainer's own proximal log-probs and weight or mask each token by pi_prox /
    pi_behaviour (decoupled PPO), for stale or engine-mismatched samples. The weights apply
    to the surrogate, not to the KL penalty.
    """

    kind: Literal["ppo_clip"] = "ppo_clip"
    eps_low: float = Field(0.2, ge=0.0, lt=1.0)
    """Lower clip: the ratio's floor is 1 - eps_low (for negative advantages)."""
    eps_high: float = Field(0.28, ge=0.0)
    """Upper clip: the ratio's ceiling is 1 + eps_high (for positive advantages). DAPO's 0.28."""
    max_ratio: float | None = Field(None, ge=1.0)
    """Cap on the PPO ratio before the min (dual-clip for negative advantages); None: no
    cap. See `ppo_clip_loss`. It never binds under a "tis" or "mis" correction, whose ratio
    is 1 in value."""
    kl_coef: float = Field(0.0, ge=0.0)
    """Weight of the k3 KL to the frozen reference model; 0 needs no reference model."""
    aggregation: AggregationConfig = Field(default_factory=TokenMean)
    """How per-token losses become one number."""
    correction: CorrectionConfig = Field(default_factory=NoCorrection)
    """Off-policy correction for samples from an older or numerically different policy."""

    @property
    def needs_reference(self) -> bool:
        """Whether `compute` needs the reference model's log-probs."""
        return self.kl_coef > 0.0

    def batch_loss(
        self,
        logp: Tensor,
        batch: TrainBatch,
        *,
        weights: Tensor,
        ref_logp: Tensor | None = None,
        proximal_logp: Tensor | None = None,
    ) -> tuple[Tensor, PolicyMetrics]:
        if batch.behaviour_logprobs is None or batch.advantages is None:
            raise ValueError(
                "the PPO clip loss needs the sampler's log-probs and advantages: "
                "build the batch with TrainBatch.from_trajectories"
            )
        return self.compute(
            logp,
            batch.behaviour_logprobs,
            batch.advantages,
            batch.target_mask,
            ref_logp=ref_logp,
            weights=weights,
            proximal_logp=proximal_logp,
        )

    def compute(
        self,
        logp: Tensor,
        behaviour_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        ref_logp: Tensor | None = None,
        weights: Tensor | None = None,
        proximal_logp: Tensor | None = None,
    ) -> tuple[Tensor, PolicyMetrics]:
        """The scalar loss to backpropagate, and metrics.

        logp, behaviour_logp, mask: (B, T); advantages: (B, 1) or (B, T); ref_logp: (B, T),
        required when `needs_reference`. weights: (B, T), this micro-batch's rows of
        `aggregation.weights(whole batch mask)`; default: this batch is the whole batch.
        proximal_logp: (B, T), the trainer's log-probs before the batch's first update, the
        anchor of a "tis" or "mis" correction; default: `logp`'s, this forward being the
        first (`trainer.updates_per_batch` 1).
        """
        from reinforge.train.losses import kl_k3, masked_mean, ppo_clip_loss

        proximal = logp.detach() if proximal_logp is None else proximal_logp  # (B, T)
        importance, corrected = self.correction.weights(
            proximal, behaviour_logp, mask
        )  # (B, T), (B, T)
        per_token, metrics = ppo_clip_loss(
            logp,
            behaviour_logp,
            advantages,
            mask,
            eps_low=self.eps_low,
            eps_high=self.eps_high,
            max_ratio=self.max_ratio,
            anchor_logp=self.correction.anchor(proximal, behaviour_logp),
            importance_weights=importance,
        )  # (B, T)
        metrics = replace(metrics, corrected_fraction=masked_mean(corrected.float(), mask))
        if self.needs_reference:
            if ref_logp is None:
                raise ValueError("kl_coef > 0 needs the reference model's log-probs")
            kl = kl_k3(logp, ref_logp, mask)  # (B, T)
            per_token = per_token + self.kl_coef * kl  # (B, T)
            metrics = replace(metrics, kl=masked_mean(kl, mask))
        if weights is None:
            weights = self.aggregation.weights(mask)  # (B, T)
        return (per_token * weights).sum(), metrics


class SFTLoss(_Loss):
    """Supervised fine-tuning: the negative log-likelihood of every trained token.

    Per token `-logp`, which is `cross_entropy` of the full logits (the trainer computes
    log-probs only where a token is trained), then aggregated like the RL losses. It reads
    no advantages and no behaviour log-probs, so stored trajectories from any source train
    as they are: the loss mask alone says which tokens are learned.
    """

    kind: Literal["sft"] = "sft"
    aggregation: AggregationConfig = Field(default_factory=TokenMean)

    def batch_loss(
        self,
        logp: Tensor,
        batch: TrainBatch,
        *,
        weights: Tensor,
        ref_logp: Tensor | None = None,
        proximal_logp: Tensor | None = None,
    ) -> tuple[Tensor, LikelihoodMetrics]:
        return self.compute(logp, batch.target_mask, weights=weights)

    def compute(
        self, logp: Tensor, mask: Tensor, weights: Tensor | None = None
    ) -> tuple[Tensor, LikelihoodMetrics]:
        """The scalar loss to backpropagate, and metrics.

        logp, mask: (B, T). weights: (B, T), as in `PPOClipLoss.compute`; default: this
        batch is the whole batch.
        """
        import torch

        from reinforge.train.losses import LikelihoodMetrics, masked_mean

        nll = torch.where(mask.bool(), -logp, 0.0)  # (B, T)
        if weights is None:
            weights = self.aggregation.weights(mask)  # (B, T)
        return (nll * weights).sum(), LikelihoodMetrics(nll=masked_mean(nll, mask))


LossConfig = Annotated[
    Annotated[PPOClipLoss, Tag("ppo_clip")] | Annotated[SFTLoss, Tag("sft")],
    tagged("kind", "ppo_clip"),
]


class AlgorithmConfig(Variant):
    """The RL algorithm: advantage estimator and loss. Defaults: GRPO advantages, DAPO-style
    token-mean PPO clip with clip-higher, no KL."""

    advantage: AdvantageConfig = Field(default_factory=GRPOAdvantage)
    """How a group's rewards become each rollout's advantage."""
    loss: LossConfig = Field(default_factory=PPOClipLoss)
    """The per-token loss and how it is aggregated."""
