"""Per-token losses and how they are summed into one number.

Every loss here returns a per-token tensor (B, T) that is exactly 0 where `mask` is 0, with
zero gradient there: one row is one sequence, `mask` is 1 on the tokens the policy sampled
(`Trajectory.loss_mask`). Padding may hold anything, even infinite log-probs.

Aggregation is a weighted sum, `loss = sum(per_token * weights)`, where `weights` (B, T)
depends only on the mask. The weights of the whole batch, sliced by rows, aggregate
micro-batches exactly: summing `(per_token[rows] * weights[rows]).sum()` over micro-batches
equals the loss of the whole batch, whichever aggregation is chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# ---- aggregation weights ----------------------------------------------------------------


def token_mean_weights(mask: Tensor) -> Tensor:
    """1 / (masked tokens in the batch) on every masked token: each token counts the same.

    DAPO (Yu et al. 2025) token-level loss: long sequences get a say in proportion to their
    length, where GRPO's sequence mean shrinks each token of a long answer. All-zero mask:
    all-zero weights. Pinned by `test_token_and_sequence_mean_differ_on_a_ragged_mask`.

    mask: (B, T). Returns (B, T).
    """
    mask = mask.float()  # (B, T)
    return mask / mask.sum().clamp(min=1.0)  # (B, T)


def sequence_mean_weights(mask: Tensor) -> Tensor:
    """Mean over each sequence's tokens, then over the sequences: GRPO's original 1/G sum 1/|o|.

    GRPO (Shao et al. 2024). Rows with no masked token are left out of the mean over
    sequences (TRL counts them as 0), so padding rows do not change the loss; the two agree
    when every row has a token. Pinned by
    `test_token_and_sequence_mean_differ_on_a_ragged_mask`.

    mask: (B, T). Returns (B, T).
    """
    mask = mask.float()  # (B, T)
    lengths = mask.sum(dim=-1, keepdim=True)  # (B, 1)
    sequences = (lengths > 0).sum().clamp(min=1)  # (), rows with at least one token
    return mask / lengths.clamp(min=1.0) / sequences  # (B, T)


def constant_norm_weights(mask: Tensor, max_tokens: int) -> Tensor:
    """1 / (B * max_tokens) on every masked token: a normaliser that ignores lengths.

    Dr. GRPO (Liu et al. 2025) divides the summed loss by a constant (the generation budget)
    so neither the sequence length nor the batch's token count rescales a token's gradient.
    B is the number of rows, empty ones included. Pinned by
    `test_token_and_sequence_mean_differ_on_a_ragged_mask`.

    mask: (B, T). Returns (B, T).
    """
    mask = mask.float()  # (B, T)
    return mask / (mask.shape[0] * max_tokens)  # (B, T)


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of `values` over masked positions; 0 for an all-zero mask. For metrics.

    values, mask: (B, T). Returns ().
    """
    return (torch.where(mask.bool(), values, 0.0).sum() / mask.sum().clamp(min=1)).detach()


# ---- from logits ------------------------------------------------------------------------


def token_logprobs(logits: Tensor, token_ids: Tensor) -> Tensor:
    """Log-probability of each token under `logits`, computed in float32.

    The caller aligns the two: `logits[..., t, :]` is the distribution `token_ids[..., t]`
    was drawn from (for a causal LM, logits of position t - 1). Every id must be a valid
    index; replace padding ids (e.g. -100) first.

    logits: (..., V), token_ids: (...). Returns (...).
    """
    logp = torch.log_softmax(logits.float(), dim=-1)  # (..., V)
    return logp.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)  # (...)


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy of each position's next-token distribution, in nats, computed in float32.

    A metric (entropy collapse is the usual early warning in RL for LLMs), not a loss term.
    Logits of -inf (masked-out vocabulary) contribute 0, with a finite gradient: their
    log-probs are clamped to the least float first, as `torch.distributions.Categorical`
    does. Pinned by `test_token_entropy`.

    logits: (..., V), e.g. (N, V). Returns (...), e.g. (N,).
    """
    logp = torch.log_softmax(logits.float(), dim=-1)  # (..., V)
    logp = logp.clamp(min=torch.finfo(logp.dtype).min)  # (..., V), -inf -> finite
    return -(logp.exp() * logp).sum(dim=-1)  # (...)


def cross_entropy(logits: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """Per-token negative log-likelihood of `targets`, 0 where `mask` is 0: the SFT loss.

    Aggregate it with the same weights as the RL losses. Targets under a 0 mask are ignored
    (they may be -100). Alignment as in `token_logprobs`. Pinned by `test_cross_entropy`.

    logits: (B, T, V), targets: (B, T), mask: (B, T). Returns (B, T).
    """
    mask = mask.bool()  # (B, T)
    safe_targets = torch.where(mask, targets, 0)  # (B, T), a valid index everywhere
    return torch.where(mask, -token_logprobs(logits, safe_targets), 0.0)  # (B, T)


# ---- policy-gradient losses -------------------------------------------------------------


def kl_k3(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """Per-token estimate of KL(policy || reference), 0 where `mask` is 0.

    The k3 estimator of Schulman's "Approximating KL Divergence" (2020), as GRPO uses it:
    with d = ref_logp - logp on tokens sampled from the policy, k3 = exp(d) - d - 1. It is
    unbiased, and never negative (e^d >= 1 + d), zero exactly when the two agree. Pinned by
    `test_kl_k3`.

    logp, ref_logp, mask: (B, T). Returns (B, T).
    """
    mask = mask.bool()  # (B, T)
    d = torch.where(mask, ref_logp - logp, 0.0)  # (B, T), 0 at padding so exp stays finite
    return torch.where(mask, torch.exp(d) - d - 1.0, 0.0)  # (B, T)


@dataclass(frozen=True)
class PolicyMetrics:
    """What the policy loss saw, each a detached 0-dim tensor averaged over masked tokens."""

    mean_ratio: Tensor
    """Mean of pi / pi_behaviour before any cap: drifts from 1 as the data goes stale."""
    clip_fraction: Tensor
    """Tokens where clipping stopped the gradient: clip_low_fraction + clip_high_fraction."""
    clip_low_fraction: Tensor
    """Advantage < 0 and ratio < 1 - eps_low."""
    clip_high_fraction: Tensor
    """Advantage > 0 and ratio > 1 + eps_high."""
    capped_fraction: Tensor
    """Tokens whose ratio was above `max_ratio` (0 without a cap)."""
    kl: Tensor | None = None
    """Mean k3 estimate of KL(policy || reference), when a reference was given."""

    def scalars(self) -> dict[str, float]:
        """What the trainer logs per step, averaged over micro-batches by their tokens."""
        scalars = {
            "ratio": float(self.mean_ratio),
            "clip_fraction": float(self.clip_fraction),
            "clip_low_fraction": float(self.clip_low_fraction),
            "clip_high_fraction": float(self.clip_high_fraction),
            "capped_fraction": float(self.capped_fraction),
        }
        if self.kl is not None:
            scalars["kl"] = float(self.kl)
        return scalars


@dataclass(frozen=True)
class LikelihoodMetrics:
    """What the SFT loss saw: a detached 0-dim tensor averaged over masked tokens."""

    nll: Tensor
    """Mean negative log-likelihood of the trained tokens, in nats."""

    def scalars(self) -> dict[str, float]:
        return {"nll": float(self.nll)}


def ppo_clip_loss(
    logp: Tensor,
    behaviour_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float,
    eps_high: float,
    max_ratio: float | None = None,
) -> tuple[Tensor, PolicyMetrics]:
    """PPO's clipped surrogate against the behaviour policy, per token, 0 where `mask` is 0.

    With r = exp(logp - behaviour_logp) and w = min(r, max_ratio) (w = r without a cap):

        loss = -min(w * A, clip(w, 1 - eps_low, 1 + eps_high) * A)

    - PPO (Schulman et al. 2017), as GRPO uses it, with one change of anchor: the "old"
      policy is the behaviour policy that sampled the tokens (the engine's log-probs), not a
      trainer-side recomputation, so staleness and engine/trainer mismatch both show up in r.
    - Asymmetric clipping, DAPO's clip-higher (Yu et al. 2025): eps_high > eps_low leaves
      room to raise the probability of unlikely tokens, against entropy collapse.
    - `max_ratio` caps the importance weight before the min. A token with r > max_ratio
      contributes the constant -max_ratio * A and no gradient. For A < 0 this is dual-clip
      PPO (Ye et al. 2020) with c = max_ratio: it bounds the loss of a stale token whose
      probability the policy has already raised far above the behaviour policy's. For A > 0
      it changes nothing unless max_ratio < 1 + eps_high. It is not the detached weight
      min(r, C) of truncated importance sampling (Yao et al. 2025), under which capped tokens
      keep a gradient; that form needs the trainer's own old log-probs. Pinned by
      `test_ppo_clip_on_both_sides_for_both_signs` and
      `test_max_ratio_caps_the_weight_before_the_min`.

    logp: (B, T), the trainer's log-probs of the sampled tokens, with gradient.
    behaviour_logp: (B, T), the sampler's log-probs (`Trajectory.logprobs` scattered onto the
        mask); anything at padding. advantages: (B, 1) one per sequence, or (B, T).
    mask: (B, T). Returns the per-token loss (B, T) and metrics.
    """
    if advantages.dim() != 2:
        raise ValueError(f"advantages must be (B, 1) or (B, T), got {tuple(advantages.shape)}")
    mask = mask.bool()  # (B, T)
    log_ratio = torch.where(mask, logp - behaviour_logp, 0.0)  # (B, T), 0 at padding
    ratio = torch.exp(log_ratio)  # (B, T)
    weight = ratio if max_ratio is None else ratio.clamp(max=max_ratio)  # (B, T)
    unclipped = weight * advantages  # (B, T)
    clipped = weight.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages  # (B, T)
    per_token = torch.where(mask, -torch.minimum(unclipped, clipped), 0.0)  # (B, T)

    with torch.no_grad():
        low = (advantages < 0) & (weight < 1.0 - eps_low)  # (B, T)
        high = (advantages > 0) & (weight > 1.0 + eps_high)  # (B, T)
        capped = ratio > max_ratio if max_ratio is not None else torch.zeros_like(mask)
        metrics = PolicyMetrics(
            mean_ratio=masked_mean(ratio, mask),
            clip_fraction=masked_mean((low | high).float(), mask),
            clip_low_fraction=masked_mean(low.float(), mask),
            clip_high_fraction=masked_mean(high.float(), mask),
            capped_fraction=masked_mean(capped.float(), mask),
        )
    return per_token, metrics
