"""Per-token losses and how they are summed into one number.

Every loss here returns a per-token tensor (B, T) that is exactly 0 where `mask` is 0, with
zero gradient there: one row is one sequence, `mask` is 1 on the tokens the policy sampled
(`Trajectory.loss_mask`). Padding may hold anything, even infinite log-probs.

Aggregation is a weighted sum, `loss = sum(per_token * weights)`, where `weights` (B, T)
depends only on the mask. The weights of the whole batch, sliced by rows, aggregate
micro-batches exactly: summing `(per_token[rows] * weights[rows]).sum()` over micro-batches
equals the loss of the whole batch, whichever aggregation is chosen.

Off-policy corrections (decoupled PPO) reweight the policy loss per token by detached
importance weights between the trainer's proximal policy and the sampler's behaviour policy;
they are 0 at padding, so the rule above still holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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


# ---- off-policy importance weights ------------------------------------------------------


def truncated_importance_weights(
    proximal_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, cap: float
) -> tuple[Tensor, Tensor]:
    """Truncated importance sampling (TIS): w = min(pi_prox / pi_behaviour, cap), detached.

    The sampler (an inference engine, possibly a few versions behind) is not the policy the
    trainer updates: its log-probs differ even for the same weights, and more when stale.
    Decoupled PPO (Hilton et al. 2022; AReaL, Fu et al. 2025) anchors the PPO ratio on the
    trainer's proximal policy and corrects for the sampler with this weight; truncating it
    at `cap` (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy
    RL training", after Espeholt et al.'s IMPALA) bounds the variance a rare token with
    pi_prox >> pi_behaviour would bring. A truncated token keeps its gradient, scaled by
    `cap`. Pinned by `test_truncated_importance_weights` and
    `test_tis_gradient_is_the_capped_weight_times_the_advantage`.

    proximal_logp, behaviour_logp, mask: (B, T); anything at padding, even inf.
    Returns the weights (B, T), 0 at padding, and the truncated tokens (B, T) bool: those
    whose ratio was above `cap`.
    """
    mask = mask.bool()  # (B, T)
    log_ratio = torch.where(mask, proximal_logp.detach() - behaviour_logp, 0.0)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T), may be inf for a wildly stale token
    truncated = mask & (ratio > cap)  # (B, T)
    return torch.where(mask, ratio.clamp(max=cap), 0.0), truncated  # (B, T), (B, T)


def masked_importance_weights(
    proximal_logp: Tensor,
    behaviour_logp: Tensor,
    mask: Tensor,
    low: float,
    high: float,
    level: Literal["token", "sequence"] = "token",
) -> tuple[Tensor, Tensor]:
    """Masked importance sampling (MIS): drop tokens whose ratio leaves [low, high].

    With r = pi_prox / pi_behaviour per token, a kept token weighs r (detached), a dropped
    one 0: IcePop's two-sided mask (Ling Team 2025, "Every Step Evolves", Ring-1T) and the
    masked IS of Liu et al. 2025 ("When Speed Kills Stability"). Where TIS still trains a
    far-off token at weight `cap`, MIS leaves it out: a token the two policies disagree on
    that much gives a gradient too biased or too noisy to keep, scaled or not.

    level "token": each token is kept by its own r. level "sequence": a sequence is kept or
    dropped whole by its geometric-mean ratio exp(mean over its tokens of log r) (Liu et
    al.'s geometric sequence mask), which does not grow with length as the product of
    ratios would, and each token of a kept sequence weighs that mean, so no weight lies
    outside [low, high] at either level. Pinned by `test_masked_importance_weights_by_token` and
    `test_masked_importance_weights_by_sequence`.

    proximal_logp, behaviour_logp, mask: (B, T); anything at padding, even inf.
    Returns the weights (B, T), 0 at padding, and the dropped tokens (B, T) bool.
    """
    mask = mask.bool()  # (B, T)
    log_ratio = torch.where(mask, proximal_logp.detach() - behaviour_logp, 0.0)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    if level == "token":
        decider = ratio  # (B, T)
    else:
        tokens = mask.sum(dim=-1, keepdim=True).clamp(min=1)  # (B, 1)
        decider = torch.exp(log_ratio.sum(dim=-1, keepdim=True) / tokens)  # (B, 1)
    keep = mask & (decider >= low) & (decider <= high)  # (B, T)
    return torch.where(keep, decider, 0.0), mask & ~keep  # (B, T), (B, T)


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
    """Mean of pi / pi_behaviour before any cap, whatever the ratio's anchor: drifts from 1
    as the data goes stale."""
    clip_fraction: Tensor
    """Tokens where clipping stopped the gradient: clip_low_fraction + clip_high_fraction."""
    clip_low_fraction: Tensor
    """Advantage < 0 and ratio < 1 - eps_low."""
    clip_high_fraction: Tensor
    """Advantage > 0 and ratio > 1 + eps_high."""
    capped_fraction: Tensor
    """Tokens whose ratio was above `max_ratio` (0 without a cap)."""
    mismatch_kl: Tensor
    """Mean k3 estimate of KL(pi_behaviour || pi) on the sampled tokens, r - 1 - log r with
    r = pi / pi_behaviour: engine/trainer mismatch plus staleness, 0 when they agree."""
    corrected_fraction: Tensor = field(default_factory=lambda: torch.zeros(()))
    """Tokens the off-policy correction truncated (TIS) or masked (MIS); 0 without one."""
    kl: Tensor | None = None
    """Mean k3 estimate of KL(policy || reference), when a reference was given."""

    def scalars(self) -> dict[str, float]:
        """What the trainer logs per step, averaged over micro-batches by their tokens: the
        field's name, but `ratio` for `mean_ratio`; `kl` only with a reference."""
        scalars = {
            "ratio": float(self.mean_ratio),
            "clip_fraction": float(self.clip_fraction),
            "clip_low_fraction": float(self.clip_low_fraction),
            "clip_high_fraction": float(self.clip_high_fraction),
            "capped_fraction": float(self.capped_fraction),
            "mismatch_kl": float(self.mismatch_kl),
            "corrected_fraction": float(self.corrected_fraction),
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
    anchor_logp: Tensor | None = None,
    importance_weights: Tensor | None = None,
) -> tuple[Tensor, PolicyMetrics]:
    """PPO's clipped surrogate, per token, 0 where `mask` is 0: by default against the
    behaviour policy, optionally decoupled from it.

    With r = exp(logp - anchor_logp), w = min(r, max_ratio) (w = r without a cap) and v the
    detached importance weight (1 without one):

        loss = -v * min(w * A, clip(w, 1 - eps_low, 1 + eps_high) * A)

    - PPO (Schulman et al. 2017), as GRPO uses it, with one change of anchor by default: the
      "old" policy is the behaviour policy that sampled the tokens (the engine's log-probs,
      `anchor_logp` None), not a trainer-side recomputation, so staleness and engine/trainer
      mismatch both show up in r, and v = 1.
    - Decoupled PPO (Hilton et al. 2022; AReaL, Fu et al. 2025): `anchor_logp` the trainer's
      proximal log-probs and `importance_weights` v ~ pi_prox / pi_behaviour (from
      `truncated_importance_weights` or `masked_importance_weights`) separate the trust
      region, clipped around the proximal policy, from the off-policy correction, v. The
      proximal policy is the trainer's weights before the batch's first update. On that
      first update it is this very forward, `anchor_logp = logp.detach()`: r = 1 in value
      with logp's gradient, the clip and `max_ratio` never bind, and a token's loss is
      -v * A with gradient -v * A per unit of logp. Later updates of the same batch
      (`trainer.updates_per_batch`) keep the first forward's log-probs as the anchor, so
      the clip bounds how far the batch moves the policy.
    - Asymmetric clipping, DAPO's clip-higher (Yu et al. 2025): eps_high > eps_low leaves
      room to raise the probability of unlikely tokens, against entropy collapse.
    - `max_ratio` caps the importance weight before the min. A token with r > max_ratio
      contributes the constant -max_ratio * A and no gradient. For A < 0 this is dual-clip
      PPO (Ye et al. 2020) with c = max_ratio: it bounds the loss of a stale token whose
      probability the policy has already raised far above the behaviour policy's. For A > 0
      it changes nothing unless max_ratio < 1 + eps_high. It is not the detached weight
      min(r, C) of truncated importance sampling (Yao et al. 2025), under which capped tokens
      keep a gradient: that is v from `truncated_importance_weights` with the proximal
      anchor (`correction.kind = "tis"` in the config). Pinned by
      `test_ppo_clip_on_both_sides_for_both_signs`,
      `test_max_ratio_caps_the_weight_before_the_min` and
      `test_tis_gradient_is_the_capped_weight_times_the_advantage`.

    Metrics `mean_ratio` and `mismatch_kl` compare logp with behaviour_logp whatever the
    anchor; the clip and cap fractions are of w.

    logp: (B, T), the trainer's log-probs of the sampled tokens, with gradient.
    behaviour_logp: (B, T), the sampler's log-probs (`Trajectory.logprobs` scattered onto the
        mask); anything at padding. advantages: (B, 1) one per sequence, or (B, T).
    mask: (B, T). anchor_logp: (B, T) without gradient; None: behaviour_logp.
    importance_weights: (B, T) detached; None: 1. Both: anything at padding.
    Returns the per-token loss (B, T) and metrics.
    """
    if advantages.dim() != 2:
        raise ValueError(f"advantages must be (B, 1) or (B, T), got {tuple(advantages.shape)}")
    mask = mask.bool()  # (B, T)
    anchor = behaviour_logp if anchor_logp is None else anchor_logp  # (B, T)
    log_ratio = torch.where(mask, logp - anchor, 0.0)  # (B, T), 0 at padding
    ratio = torch.exp(log_ratio)  # (B, T)
    weight = ratio if max_ratio is None else ratio.clamp(max=max_ratio)  # (B, T)
    unclipped = weight * advantages  # (B, T)
    clipped = weight.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages  # (B, T)
    surrogate = -torch.minimum(unclipped, clipped)  # (B, T)
    if importance_weights is not None:
        # 0 at padding first: a 0 gradient times an infinite weight would be NaN.
        surrogate = surrogate * torch.where(mask, importance_weights.detach(), 0.0)  # (B, T)
    per_token = torch.where(mask, surrogate, 0.0)  # (B, T)

    with torch.no_grad():
        low = (advantages < 0) & (weight < 1.0 - eps_low)  # (B, T)
        high = (advantages > 0) & (weight > 1.0 + eps_high)  # (B, T)
        capped = ratio > max_ratio if max_ratio is not None else torch.zeros_like(mask)
        behaviour_ratio = torch.exp(torch.where(mask, logp - behaviour_logp, 0.0))  # (B, T)
        metrics = PolicyMetrics(
            mean_ratio=masked_mean(behaviour_ratio, mask),
            clip_fraction=masked_mean((low | high).float(), mask),
            clip_low_fraction=masked_mean(low.float(), mask),
            clip_high_fraction=masked_mean(high.float(), mask),
            capped_fraction=masked_mean(capped.float(), mask),
            mismatch_kl=masked_mean(kl_k3(behaviour_logp, logp, mask), mask),
        )
    return per_token, metrics
