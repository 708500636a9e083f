"""Group-relative advantages: how much better each rollout did than its siblings.

A group is the n rollouts of one task. Both estimators centre the rewards on the group mean,
so a group where every rollout scored the same gives every token a zero advantage and no
gradient. The caller passes only the rollouts that take part in the gradient: errored ones
are left out before this point (a broken rollout is data, never a silent zero), so they do
not move the mean.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


def dr_grpo_advantages(rewards: Tensor) -> Tensor:
    """`r - mean(r)` within each group.

    Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training") drops GRPO's division by
    the group std: dividing by a small std gives near-solved and near-hopeless tasks the
    largest updates, a difficulty bias. Pinned by `test_dr_grpo_only_centres`.

    rewards: (..., G), the last dimension is one group. Returns (..., G).
    """
    return rewards - rewards.mean(dim=-1, keepdim=True)  # (..., G)


def grpo_advantages(rewards: Tensor, eps: float = 1e-4) -> Tensor:
    """`(r - mean(r)) / (std(r) + eps)` within each group.

    GRPO (Shao et al. 2024, DeepSeekMath). The std is the *sample* std (Bessel-corrected,
    divisor G - 1, `torch.std`'s default) because TRL's GRPOTrainer uses it, with the same
    `eps = 1e-4`, so runs compare with TRL's; the paper does not say which. The population std
    (divisor G) would give advantages larger by sqrt(G / (G - 1)): 15% for G = 4. A group of
    one has no sample std and no sibling to compare with: its advantage is 0. Pinned by
    `test_grpo_uses_the_sample_std`.

    rewards: (..., G), the last dimension is one group. Returns (..., G).
    """
    centred = dr_grpo_advantages(rewards)  # (..., G)
    if rewards.shape[-1] < 2:
        return centred  # all zeros
    std = rewards.std(dim=-1, keepdim=True)  # (..., 1), divisor G - 1
    return centred / (std + eps)  # (..., G)
