"""The RL algorithm as config: which advantage, loss, aggregation and off-policy
correction to use, and what becomes of a truncated completion.

Each variant is a small pydantic model tagged by `kind` that applies itself, so
the trainer calls `config.advantage.compute(rewards)` and `config.loss.batch_loss(...)` and
never branches on a name. Unknown keys and unknown kinds are rejected when the config is loaded.

A command loads its config before anything heavy, so that a typo is answered at once: the
methods import the arithmetic (`losses`, which needs torch) when they first run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Tag

from reinforge.train.advantages import dr_grpo_advantages, grpo_advantages
from reinforge.types import Status, tagged

if TYPE_CHECKING:
    from torch import Tensor

    from reinforge.train.batching import TrainBatch
    from reinforge.train.losses import LikelihoodMetrics, PolicyMetrics
    from reinforge.types import Trajectory


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


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
    tagged("kind", "grpo"),
]


# ---- truncated completions --------------------------------------------------------------


class _Truncation(_Config):
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


def _by_kind(value: Any) -> Any:
    """`truncated = "mask"`: a variant named by its kind alone, all else its defaults."""
    return {"kind": value} if isinstance(value, str) else value


TruncatedConfig = Annotated[
    Annotated[Keep, Tag("keep")]
    | Annotated[Mask, Tag("mask")]
    | Annotated[Penalize, Tag("penalize")],
    tagged("kind", "keep"),
    BeforeValidator(_by_kind),
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


class _Correction(_Config, ABC):
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


# ---- losses -----------------------------------------------------------------------------


class _Loss(_Config, ABC):
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


class AlgorithmConfig(_Config):
    """The RL algorithm: advantage estimator and loss. Defaults: GRPO advantages, DAPO-style
    token-mean PPO clip with clip-higher, no KL."""

    advantage: AdvantageConfig = Field(default_factory=GRPOAdvantage)
    """How a group's rewards become each rollout's advantage."""
    loss: LossConfig = Field(default_factory=PPOClipLoss)
    """The per-token loss and how it is aggregated."""
