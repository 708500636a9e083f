"""The algorithm part of the training config: which advantage, loss and aggregation to use.

Each variant is a small pydantic model tagged by `kind` that applies itself, so the trainer
calls `config.advantage.compute(rewards)` and `config.loss.compute(...)` and never branches
on a name. Unknown keys and unknown kinds are rejected when the config is loaded.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag
from torch import Tensor

from reinforge.train.advantages import dr_grpo_advantages, grpo_advantages
from reinforge.train.losses import (
    LikelihoodMetrics,
    PolicyMetrics,
    constant_norm_weights,
    kl_k3,
    masked_mean,
    ppo_clip_loss,
    sequence_mean_weights,
    token_mean_weights,
)


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _kind_or(default: str) -> Discriminator:
    """Choose a union member by its `kind`, taking `default` when the input names none, so
    an override such as `loss.kl_coef=0.1` needs no `kind`."""

    def kind(value: Any) -> str:
        if isinstance(value, dict):
            return value.get("kind", default)
        return getattr(value, "kind", default)

    return Discriminator(kind)


# ---- advantages -------------------------------------------------------------------------


class GRPOAdvantage(_Config):
    """(r - mean) / (sample std + eps) within the group; see `grpo_advantages`."""

    kind: Literal["grpo"] = "grpo"
    eps: float = Field(1e-4, gt=0.0)
    """Added to the std so a group of equal rewards divides 0 by eps, not by 0. TRL's value."""

    def compute(self, rewards: Tensor) -> Tensor:
        """rewards: (G,) one group, or (N, G) equal-size groups. Same shape back."""
        return grpo_advantages(rewards, self.eps)


class DrGRPOAdvantage(_Config):
    """r - mean within the group, no std; see `dr_grpo_advantages`."""

    kind: Literal["dr_grpo"] = "dr_grpo"

    def compute(self, rewards: Tensor) -> Tensor:
        """rewards: (G,) one group, or (N, G) equal-size groups. Same shape back."""
        return dr_grpo_advantages(rewards)


AdvantageConfig = Annotated[
    Annotated[GRPOAdvantage, Tag("grpo")] | Annotated[DrGRPOAdvantage, Tag("dr_grpo")],
    _kind_or("grpo"),
]


# ---- aggregation ------------------------------------------------------------------------


class _Aggregation(_Config, ABC):
    @abstractmethod
    def weights(self, mask: Tensor) -> Tensor:
        """Per-token weights (B, T) of the whole batch; slice rows for a micro-batch."""

    def aggregate(self, per_token: Tensor, mask: Tensor) -> Tensor:
        """One scalar from a per-token loss (B, T) that is 0 where mask (B, T) is 0."""
        return (per_token * self.weights(mask)).sum()


class TokenMean(_Aggregation):
    """Mean over every masked token of the batch (DAPO); see `token_mean_weights`."""

    kind: Literal["token_mean"] = "token_mean"

    def weights(self, mask: Tensor) -> Tensor:
        return token_mean_weights(mask)


class SequenceMean(_Aggregation):
    """Mean over each sequence, then over sequences (GRPO); see `sequence_mean_weights`."""

    kind: Literal["sequence_mean"] = "sequence_mean"

    def weights(self, mask: Tensor) -> Tensor:
        return sequence_mean_weights(mask)


class ConstantNorm(_Aggregation):
    """Sum / (B * max_tokens) (Dr. GRPO); see `constant_norm_weights`."""

    kind: Literal["constant_norm"] = "constant_norm"
    max_tokens: int = Field(gt=0)
    """The constant: usually the generation budget in tokens per rollout."""

    def weights(self, mask: Tensor) -> Tensor:
        return constant_norm_weights(mask, self.max_tokens)


AggregationConfig = Annotated[
    Annotated[TokenMean, Tag("token_mean")]
    | Annotated[SequenceMean, Tag("sequence_mean")]
    | Annotated[ConstantNorm, Tag("constant_norm")],
    _kind_or("token_mean"),
]


# ---- losses -----------------------------------------------------------------------------


class PPOClipLoss(_Config):
    """Clipped surrogate against the behaviour policy, plus an optional k3 KL penalty.

    Per token: `ppo_clip_loss(...) + kl_coef * kl_k3(...)`, then aggregated.
    """

    kind: Literal["ppo_clip"] = "ppo_clip"
    eps_low: float = Field(0.2, ge=0.0, lt=1.0)
    """Lower clip: the ratio's floor is 1 - eps_low (for negative advantages)."""
    eps_high: float = Field(0.28, ge=0.0)
    """Upper clip: the ratio's ceiling is 1 + eps_high (for positive advantages). DAPO's 0.28."""
    max_ratio: float | None = Field(None, ge=1.0)
    """Cap on pi / pi_behaviour before the min (dual-clip for negative advantages); None: no
    cap. See `ppo_clip_loss`."""
    kl_coef: float = Field(0.0, ge=0.0)
    """Weight of the k3 KL to the frozen reference model; 0 needs no reference model."""
    aggregation: AggregationConfig = Field(default_factory=TokenMean)
    """How per-token losses become one number."""

    @property
    def needs_reference(self) -> bool:
        """Whether `compute` needs the reference model's log-probs."""
        return self.kl_coef > 0.0

    def compute(
        self,
        logp: Tensor,
        behaviour_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        ref_logp: Tensor | None = None,
        weights: Tensor | None = None,
    ) -> tuple[Tensor, PolicyMetrics]:
        """The scalar loss to backpropagate, and metrics.

        logp, behaviour_logp, mask: (B, T); advantages: (B, 1) or (B, T); ref_logp: (B, T),
        required when `needs_reference`. weights: (B, T), this micro-batch's rows of
        `aggregation.weights(whole batch mask)`; default: this batch is the whole batch.
        """
        per_token, metrics = ppo_clip_loss(
            logp,
            behaviour_logp,
            advantages,
            mask,
            eps_low=self.eps_low,
            eps_high=self.eps_high,
            max_ratio=self.max_ratio,
        )  # (B, T)
        if self.needs_reference:
            if ref_logp is None:
                raise ValueError("kl_coef > 0 needs the reference model's log-probs")
            kl = kl_k3(logp, ref_logp, mask)  # (B, T)
            per_token = per_token + self.kl_coef * kl  # (B, T)
            metrics = replace(metrics, kl=masked_mean(kl, mask))
        if weights is None:
            weights = self.aggregation.weights(mask)  # (B, T)
        return (per_token * weights).sum(), metrics


class SFTLoss(_Config):
    """Supervised fine-tuning: the negative log-likelihood of every trained token.

    Per token `-logp`, which is `cross_entropy` of the full logits (the trainer computes
    log-probs only where a token is trained), then aggregated like the RL losses. Advantages
    and behaviour log-probs are ignored, so stored trajectories from any source train as
    they are: the loss mask alone says which tokens are learned.
    """

    kind: Literal["sft"] = "sft"
    aggregation: AggregationConfig = Field(default_factory=TokenMean)

    @property
    def needs_reference(self) -> bool:
        return False

    def compute(
        self,
        logp: Tensor,
        behaviour_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        ref_logp: Tensor | None = None,
        weights: Tensor | None = None,
    ) -> tuple[Tensor, LikelihoodMetrics]:
        """Same arguments as `PPOClipLoss.compute`; only logp, mask and weights are used."""
        nll = torch.where(mask.bool(), -logp, 0.0)  # (B, T)
        if weights is None:
            weights = self.aggregation.weights(mask)  # (B, T)
        return (nll * weights).sum(), LikelihoodMetrics(nll=masked_mean(nll, mask))


LossConfig = Annotated[
    Annotated[PPOClipLoss, Tag("ppo_clip")] | Annotated[SFTLoss, Tag("sft")],
    _kind_or("ppo_clip"),
]


class AlgorithmConfig(_Config):
    """The RL algorithm: advantage estimator and loss. Defaults: GRPO advantages, DAPO-style
    token-mean PPO clip with clip-higher, no KL."""

    advantage: AdvantageConfig = Field(default_factory=GRPOAdvantage)
    loss: LossConfig = Field(default_factory=PPOClipLoss)
