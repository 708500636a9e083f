"""How each token of a batch weighs in the loss: the aggregation that turns per-token
losses into one scalar, and the off-policy correction of tokens another policy sampled.
Variants of the algorithm config (`train/algorithm.py`), tagged by `kind`, each applying
itself; their arithmetic is in `losses`, imported when first run (it needs torch)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Tag

from reinforge.types import tagged

if TYPE_CHECKING:
    from torch import Tensor


class Variant(BaseModel):
    """One variant of a part of the algorithm: frozen, and no key it does not declare."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


# ---- aggregation ------------------------------------------------------------------------


class _Aggregation(Variant, ABC):
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
        from reinforge.train.losses import token_mean_weights

        return token_mean_weights(mask)


class SequenceMean(_Aggregation):
    """Mean over each sequence, then over sequences (GRPO); see `sequence_mean_weights`."""

    kind: Literal["sequence_mean"] = "sequence_mean"

    def weights(self, mask: Tensor) -> Tensor:
        from reinforge.train.losses import sequence_mean_weights

        return sequence_mean_weights(mask)


class ConstantNorm(_Aggregation):
    """Sum / (B * max_tokens) (Dr. GRPO); see `constant_norm_weights`."""

    kind: Literal["constant_norm"] = "constant_norm"
    max_tokens: int | None = Field(None, gt=0)
    """The constant; None: the environment's generation budget per rollout (its harness's
    total token limit, else turns x tokens per turn)."""

    def weights(self, mask: Tensor) -> Tensor:
        if self.max_tokens is None:
            raise ValueError("constant_norm needs max_tokens: see TrainerConfig.for_budget")
        from reinforge.train.losses import constant_norm_weights

        return constant_norm_weights(mask, self.max_tokens)


AggregationConfig = Annotated[
    Annotated[TokenMean, Tag("token_mean")]
    | Annotated[SequenceMean, Tag("sequence_mean")]
    | Annotated[ConstantNorm, Tag("constant_norm")],
    tagged("kind", "token_mean"),
]


# ---- off-policy corrections -------------------------------------------------------------


class _Correction(Variant, ABC):
    """How the PPO loss accounts for tokens sampled by a policy other than the trainer's:
    the engine's log-probs differ from the trainer's even for the same weights, and the
    weights themselves may be a few versions old in an asynchronous loop."""

    def anchor(self, proximal_logp: Tensor, behaviour_logp: Tensor) -> Tensor:
        """The PPO ratio's "old" policy: the trainer's proximal log-probs, those of the
        weights before the batch's first update (decoupled PPO, Hilton et al. 2022).
        proximal_logp, behaviour_logp: (B, T). Returns (B, T)."""
        return proximal_logp

    @abstractmethod
    def weights(
        self, proximal_logp: Tensor, behaviour_logp: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Detached per-token weights of the policy loss (B, T), 0 at padding, and the
        tokens they corrected (B, T) bool. All inputs (B, T)."""


class NoCorrection(_Correction):
    """None: the PPO ratio is against the behaviour log-probs, every token weighs 1; the
    loss of before corrections existed, bit for bit (pinned by
    `test_no_correction_is_the_behaviour_anchored_loss_bit_for_bit`)."""

    kind: Literal["none"] = "none"

    def anchor(self, proximal_logp: Tensor, behaviour_logp: Tensor) -> Tensor:
        return behaviour_logp

    def weights(
        self, proximal_logp: Tensor, behaviour_logp: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        import torch

        mask = mask.bool()  # (B, T)
        return mask.float(), torch.zeros_like(mask)  # (B, T), (B, T)


class TruncatedIS(_Correction):
    """Truncated importance sampling: the ratio is against the trainer's proximal policy and
    each token's loss is weighted by min(pi_prox / pi_behaviour, cap), detached (Yao et al.
    2025); see `truncated_importance_weights`."""

    kind: Literal["tis"] = "tis"
    cap: float = Field(2.0, ge=1.0)
    """Largest weight; a token above it keeps its gradient, scaled by `cap`. At least 1, so
    tokens the two policies agree on are never down-weighted."""

    def weights(
        self, proximal_logp: Tensor, behaviour_logp: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        from reinforge.train.losses import truncated_importance_weights

        return truncated_importance_weights(proximal_logp, behaviour_logp, mask, self.cap)


class MaskedIS(_Correction):
    """Masked importance sampling: the ratio is against the trainer's proximal policy; a
    token whose pi_prox / pi_behaviour leaves [low, high] is left out of the loss, a kept
    one weighs its ratio (at sequence level, the sequence's), detached (IcePop, Ling Team
    2025; Liu et al. 2025); see
    `masked_importance_weights`."""

    kind: Literal["mis"] = "mis"
    low: float = Field(0.5, gt=0.0, lt=1.0)
    """Smallest kept ratio, below 1 so that agreeing policies keep every token."""
    high: float = Field(2.0, gt=1.0)
    """Largest kept ratio, above 1."""
    level: Literal["token", "sequence"] = "token"
    """token: each token is kept by its own ratio. sequence: a sequence is kept or dropped
    whole by its geometric-mean ratio over its tokens, which each of its tokens then
    weighs."""

    def weights(
        self, proximal_logp: Tensor, behaviour_logp: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        from reinforge.train.losses import masked_importance_weights

        return masked_importance_weights(
            proximal_logp, behaviour_logp, mask, self.low, self.high, self.level
        )


CorrectionConfig = Annotated[
    Annotated[NoCorrection, Tag("none")]
    | Annotated[TruncatedIS, Tag("tis")]
    | Annotated[MaskedIS, Tag("mis")],
    tagged("kind", "none"),
]
