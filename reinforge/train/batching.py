"""From trajectories to padded training tensors, and from a batch to micro-batches.

One row is one trajectory, right-padded: the (B, T) layout the losses in `losses.py` expect.
The masks are shifted to the causal LM's view: the logits at position t predict token t + 1,
so position t is trained iff token t + 1 was sampled by the policy. Getting this shift wrong
trains the model on the prompt, or on nothing, without any error; it lives here only.

Micro-batches group rows of similar length, so a batch with a few long episodes does not pad
every row to the longest one (TRL pads every completion to the batch's longest).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from reinforge.types import Trajectory


@dataclass(frozen=True)
class TrainBatch:
    """Right-padded tensors of a list of trajectories, aligned to the logits' positions.

    Build with `from_trajectories`; take micro-batches with `select`.
    """

    input_ids: Tensor
    """(B, T) int64: each trajectory's `token_ids`, then 0 as padding."""
    attention_mask: Tensor
    """(B, T) int64: 1 on real tokens, 0 on padding."""
    target_mask: Tensor
    """(B, T) bool: True at t iff token t + 1 was sampled by the policy (the loss mask
    shifted left by one). The `mask` of the losses."""
    targets: Tensor
    """(B, T) int64: token t + 1, or 0 where there is none (last token, padding)."""
    behaviour_logprobs: Tensor
    """(B, T) float32: the sampler's log-prob of token t + 1 where `target_mask`, else 0."""
    advantages: Tensor
    """(B, 1) float32: one per trajectory."""

    @classmethod
    def from_trajectories(
        cls, trajectories: Sequence[Trajectory], advantages: Sequence[float] | Tensor
    ) -> TrainBatch:
        """Pad and shift. Raises ValueError on inconsistent trajectories.

        Status is not looked at: leave errored rollouts out before calling.
        advantages: (B,), one per trajectory.
        """
        advantages = torch.as_tensor(advantages, dtype=torch.float32)  # (B,)
        if advantages.shape != (len(trajectories),):
            raise ValueError(
                f"need one advantage per trajectory: {len(trajectories)} trajectories, "
                f"advantages of shape {tuple(advantages.shape)}"
            )
        if not trajectories:
            raise ValueError("cannot build a batch from no trajectories")
        if not torch.isfinite(advantages).all():
            raise ValueError(f"advantages must be finite, got {advantages.tolist()}")
        for trajectory in trajectories:
            _check(trajectory)

        rows, width = len(trajectories), max(len(t.token_ids) for t in trajectories)
        input_ids = torch.zeros(rows, width, dtype=torch.long)  # (B, T)
        attention_mask = torch.zeros(rows, width, dtype=torch.long)  # (B, T)
        target_mask = torch.zeros(rows, width, dtype=torch.bool)  # (B, T)
        behaviour = torch.zeros(rows, width, dtype=torch.float32)  # (B, T)
        for row, trajectory in enumerate(trajectories):
            n = len(trajectory.token_ids)
            input_ids[row, :n] = torch.tensor(trajectory.token_ids)
            attention_mask[row, :n] = 1
            sampled = torch.tensor(trajectory.loss_mask[1:], dtype=torch.bool)  # (n - 1,)
            target_mask[row, : n - 1] = sampled
            behaviour[row, : n - 1][sampled] = torch.tensor(trajectory.logprobs)
        targets = torch.zeros_like(input_ids)  # (B, T)
        targets[:, :-1] = input_ids[:, 1:]  # padding ids are 0, so "none" is 0 too
        return cls(
            input_ids=input_ids,
            attention_mask=attention_mask,
            target_mask=target_mask,
            targets=targets,
            behaviour_logprobs=behaviour,
            advantages=advantages.unsqueeze(-1),  # (B, 1)
        )

    @property
    def lengths(self) -> list[int]:
        """Real tokens per row: what `micro_batches` groups by."""
        return self.attention_mask.sum(dim=-1).tolist()

    @property
    def width(self) -> int:
        """T, the number of columns. A micro-batch's whole-batch weights are
        `weights[rows, :micro.width]`."""
        return self.input_ids.shape[1]

    def select(self, rows: Sequence[int]) -> TrainBatch:
        """These rows, in this order, with the columns cut to their longest row.

        The columns cut are padding in every selected row, so nothing trainable is lost:
        the loss of the micro-batch is that of the same rows uncut.
        """
        if not rows:
            raise ValueError("select needs at least one row")
        index = torch.as_tensor(rows, dtype=torch.long)  # (b,)
        width = int(self.attention_mask[index].sum(dim=-1).max())
        return TrainBatch(**{f.name: getattr(self, f.name)[index, :width] for f in fields(self)})

    def to(self, device: torch.device | str) -> TrainBatch:
        """Every tensor on `device`."""
        return TrainBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def _check(trajectory: Trajectory) -> None:
    """Raise ValueError naming the trajectory if its tokens, mask and log-probs disagree."""
    name = f"trajectory {trajectory.task_id}/{trajectory.group_id}#{trajectory.index}"
    tokens, mask = trajectory.token_ids, trajectory.loss_mask
    if not tokens:
        raise ValueError(f"{name} has no tokens")
    if len(mask) != len(tokens):
        raise ValueError(f"{name}: {len(tokens)} token_ids but {len(mask)} loss_mask entries")
    if any(m not in (0, 1) for m in mask):
        raise ValueError(f"{name}: loss_mask must hold only 0 and 1")
    if mask[0]:
        raise ValueError(f"{name}: the first token is marked sampled, but nothing predicts it")
    if sum(mask) != len(trajectory.logprobs):
        raise ValueError(
            f"{name}: {sum(mask)} sampled tokens (loss_mask) but "
            f"{len(trajectory.logprobs)} logprobs; they must be one per sampled token"
        )
    if not all(math.isfinite(lp) for lp in trajectory.logprobs):
        raise ValueError(f"{name}: a sampled token's logprob is not finite")
    if min(tokens) < 0:
        raise ValueError(f"{name}: token ids must not be negative")


def micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Row indices grouped so that rows x longest row <= token_budget in each group.

    Rows are taken longest first (ties by index), and a group closes when the next row would
    break the budget; so each group holds rows of similar length and pads little, and the
    first group is the one of most padded tokens, where running out of memory shows at once.
    A row longer than the budget gets a group of its own. Deterministic.

    lengths: one per row (`TrainBatch.lengths`). Returns the groups, each longest first.
    """
    if token_budget <= 0:
        raise ValueError(f"token_budget must be positive, got {token_budget}")
    if any(length < 0 for length in lengths):
        raise ValueError("lengths must not be negative")
    order = sorted(range(len(lengths)), key=lambda row: (-lengths[row], row))
    groups: list[list[int]] = []
    for row in order:
        # The group's first row is its longest, so adding a row costs its longest length.
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= token_budget:
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups
