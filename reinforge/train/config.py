"""The trainer's config sections: optimizer, trainer options, LoRA, and the algorithm (which
advantage, loss and aggregation to use).

Each algorithm variant is a small pydantic model tagged by `kind` that applies itself, so
the trainer calls `config.advantage.compute(rewards)` and `config.loss.batch_loss(...)` and
never branches on a name. Unknown keys and unknown kinds are rejected when the config is loaded.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

import torch
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator
from torch import Tensor

from reinforge.train.advantages import dr_grpo_advantages, grpo_advantages
from reinforge.train.losses import (
    LikelihoodMetrics,
    PolicyMetrics,
    constant_norm_weights,
    kl_k3,
    masked_importance_weights,
    masked_mean,
    ppo_clip_loss,
    sequence_mean_weights,
    token_mean_weights,
    truncated_importance_weights,
)
from reinforge.types import Section, Status

if TYPE_CHECKING:
    from reinforge.train.batching import TrainBatch


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


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
    max_tokens: int | None = Field(None, gt=0)
    """The constant; None: the environment's generation budget per rollout (its harness's
    total token limit, else turns x tokens per turn)."""

    def weights(self, mask: Tensor) -> Tensor:
        if self.max_tokens is None:
            raise ValueError("constant_norm needs max_tokens: see TrainerConfig.for_budget")
        return constant_norm_weights(mask, self.max_tokens)


AggregationConfig = Annotated[
    Annotated[TokenMean, Tag("token_mean")]
    | Annotated[SequenceMean, Tag("sequence_mean")]
    | Annotated[ConstantNorm, Tag("constant_norm")],
    _kind_or("token_mean"),
]


# ---- off-policy corrections -------------------------------------------------------------


class _Correction(_Config, ABC):
    """How the PPO loss accounts for tokens sampled by a policy other than the trainer's:
    the engine's log-probs differ from the trainer's even for the same weights, and the
    weights themselves may be a few versions old in an asynchronous loop."""

    def anchor(self, logp: Tensor, behaviour_logp: Tensor) -> Tensor:
        """The PPO ratio's "old" policy: the trainer's proximal log-probs, i.e. this forward
        detached, which the trainer's one optimizer step per batch has not yet changed
        (decoupled PPO, Hilton et al. 2022). logp, behaviour_logp: (B, T). Returns (B, T)."""
        return logp.detach()

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

    def anchor(self, logp: Tensor, behaviour_logp: Tensor) -> Tensor:
        return behaviour_logp

    def weights(
        self, proximal_logp: Tensor, behaviour_logp: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
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
        return masked_importance_weights(
            proximal_logp, behaviour_logp, mask, self.low, self.high, self.level
        )


CorrectionConfig = Annotated[
    Annotated[NoCorrection, Tag("none")]
    | Annotated[TruncatedIS, Tag("tis")]
    | Annotated[MaskedIS, Tag("mis")],
    _kind_or("none"),
]


# ---- losses -----------------------------------------------------------------------------


class _Loss(_Config, ABC):
    @property
    def needs_reference(self) -> bool:
        """Whether `batch_loss` needs the reference model's log-probs."""
        return False

    @abstractmethod
    def batch_loss(
        self, logp: Tensor, batch: TrainBatch, *, weights: Tensor, ref_logp: Tensor | None = None
    ) -> tuple[Tensor, PolicyMetrics | LikelihoodMetrics]:
        """The trainer's one call: the scalar loss of a micro-batch and metrics, each loss
        reading from `batch` only the fields it needs, so one trainer steps every loss.

        logp: (b, t), the trainer's log-probs of `batch.targets`, with gradient. weights:
        (b, t), this micro-batch's rows of `aggregation.weights(whole batch mask)`.
        ref_logp: (b, t), the reference model's, when `needs_reference`.
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
        self, logp: Tensor, batch: TrainBatch, *, weights: Tensor, ref_logp: Tensor | None = None
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
        )

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
        importance, corrected = self.correction.weights(
            logp.detach(), behaviour_logp, mask
        )  # (B, T), (B, T)
        per_token, metrics = ppo_clip_loss(
            logp,
            behaviour_logp,
            advantages,
            mask,
            eps_low=self.eps_low,
            eps_high=self.eps_high,
            max_ratio=self.max_ratio,
            anchor_logp=self.correction.anchor(logp, behaviour_logp),
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
        self, logp: Tensor, batch: TrainBatch, *, weights: Tensor, ref_logp: Tensor | None = None
    ) -> tuple[Tensor, LikelihoodMetrics]:
        return self.compute(logp, batch.target_mask, weights=weights)

    def compute(
        self, logp: Tensor, mask: Tensor, weights: Tensor | None = None
    ) -> tuple[Tensor, LikelihoodMetrics]:
        """The scalar loss to backpropagate, and metrics.

        logp, mask: (B, T). weights: (B, T), as in `PPOClipLoss.compute`; default: this
        batch is the whole batch.
        """
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
    """How a group's rewards become each rollout's advantage."""
    loss: LossConfig = Field(default_factory=PPOClipLoss)
    """The per-token loss and how it is aggregated."""


# ---- optimizer and trainer options ------------------------------------------------------


class OptimConfig(Section):
    """AdamW over the trainable parameters."""

    lr: float = Field(1e-5, gt=0.0)
    """Learning rate after warm-up."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW's decoupled weight decay."""
    warmup_steps: int = Field(0, ge=0)
    """Steps over which the learning rate rises linearly from lr / warmup_steps to lr."""
    schedule: Literal["constant", "cosine"] = "constant"
    """After warm-up: constant, or cosine decay to 0 at the last step."""
    grad_clip: float = Field(1.0, gt=0.0)
    """Gradients are scaled so their global norm is at most this."""


class LoRAConfig(Section):
    """Low-rank adapters through PEFT: only the adapters train, the base stays frozen."""

    rank: int = Field(16, ge=1)
    """Rank of each adapter's low-rank update."""
    alpha: float = Field(32.0, gt=0.0)
    """The update is scaled by alpha / rank."""
    target_modules: str | list[str] = "all-linear"
    """PEFT's module selection: "all-linear" (every linear layer but the LM head) or names."""


class TrainerConfig(Section):
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    micro_batch_tokens: int = Field(1024, ge=1)
    """Token budget of one forward/backward (rows x longest row); gradients accumulate.
    Activations grow with it (~1.4 MB per token for SmolLM2-135M in fp32); on a CPU 1024
    was both leaner and faster than 4096 (benchmarks/train_step.py)."""
    precision: Literal["float32", "bfloat16"] = "float32"
    """bfloat16: the decoder's matmuls run in bf16 under autocast (AMX on recent x86 CPUs,
    tensor cores on GPUs); weights, gradients, optimizer state, the LM head and the
    log-softmax stay float32."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in backward: less memory, more compute."""
    lora: LoRAConfig | None = None
    """Train LoRA adapters instead of every weight; None: full fine-tuning."""
    truncated: Literal["keep", "mask", "penalize"] = "keep"
    """A completion cut off by a token or turn limit: keep (train on it with its reward),
    mask (it still counts in its group's baseline but is left out of the loss, DAPO's
    overlong filtering) or penalize (its reward becomes `truncation_penalty`)."""
    truncation_penalty: float = 0.0
    """The reward of a truncated completion when `truncated = "penalize"`."""
    world_size: int = Field(1, ge=1)
    """Processes (ranks) training one model, each holding a shard of its weights, gradients
    and optimizer state (FSDP2) and running its share of each batch's micro-batches; gloo
    on CPU, NCCL with one GPU per rank. `reinforge train` and `reinforge sft` run 1 so far;
    see docs/scale.md."""
    collective_timeout_s: float = Field(600.0, gt=0.0)
    """How long a rank waits in a collective for the others before it fails, so a dead or
    stuck rank ends the run with an error instead of a hang. Long enough for the slowest
    step, and for rank 0 saving a checkpoint while the others wait."""

    def for_budget(self, max_sampled_tokens: int) -> Self:
        """This config with a constant-norm aggregation that names no constant given the
        environment's generation budget, so the value is derived, not asked for twice."""
        aggregation = self.algorithm.loss.aggregation
        if not isinstance(aggregation, ConstantNorm) or aggregation.max_tokens is not None:
            return self
        loss = self.algorithm.loss.model_copy(
            update={"aggregation": ConstantNorm(max_tokens=max_sampled_tokens)}
        )
        algorithm = self.algorithm.model_copy(update={"loss": loss})
        return self.model_copy(update={"algorithm": algorithm})


class SFTConfig(Section):
    """`reinforge sft`: supervised warm-up on stored trajectories. The model, optimizer,
    trainer and run sections apply as in RL; `run.steps` is derived from the data."""

    data: list[Path] = Field(default_factory=list)
    """Trajectory JSONL files, or folders: a `reinforge eval` output (trajectories.jsonl)
    or a training run (trajectories/*.jsonl)."""
    min_reward: float | None = None
    """Keep only trajectories whose reward is at least this; None keeps every reward."""
    statuses: list[Status] = Field(default_factory=lambda: [Status.OK])
    """Keep only trajectories that ended so; a truncated one teaches an unfinished answer."""
    epochs: int = Field(1, ge=1)
    """Passes over the kept trajectories, each in a new order drawn from run.seed."""
    batch_size: int = Field(32, ge=1)
    """Trajectories per optimizer step."""

    @field_validator("data", mode="before")
    @classmethod
    def _one_path(cls, value: Any) -> Any:
        """`sft.data=runs/eval-arith` on the command line is one path, not a list."""
        return [value] if isinstance(value, str | Path) else value
