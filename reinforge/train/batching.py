"""From trajectories to padded training tensors, and from a batch to micro-batches.

One row is one trajectory, right-padded: the (B, T) layout the losses in `losses.py` expect.
The masks are shifted to the causal LM's view: the logits at position t predict token t + 1,
so position t is trained iff token t + 1 was sampled by the policy. Getting this shift wrong
trains the model on the prompt, or on nothing, without any error; it lives here only.

Micro-batches group rows of similar length, so a batch with a few long episodes does not pad
every row to the longest one (TRL pads every completion to the batch's longest); or rows
that open alike, so a group's prompt runs once for all its rollouts: whichever computes
fewer tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from reinforge.types import Trajectory


@dataclass(frozen=True)
class TrainBatch:
    """Right-padded tensors of a list of trajectories, aligned to the logits' positions.

    Build with `from_trajectories` (a policy's samples, for RL) or `from_sequences` (tokens
    and masks alone, for SFT); take micro-batches with `select`.
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
    behaviour_logprobs: Tensor | None = None
    """(B, T) float32: the sampler's log-prob of token t + 1 where `target_mask`, else 0.
    None in a batch of sequences no policy sampled (`from_sequences`)."""
    advantages: Tensor | None = None
    """(B, 1) float32, one per trajectory; or (B, T), one per token where `target_mask`
    (0 elsewhere) when some trajectory has one per sampled token. None as
    `behaviour_logprobs`."""

    @classmethod
    def from_trajectories(
        cls,
        trajectories: Sequence[Trajectory],
        advantages: Sequence[float | Sequence[float]] | Tensor,
    ) -> TrainBatch:
        """Pad and shift, with the sampler's log-probs. Raises ValueError on inconsistent
        trajectories.

        Status is not looked at: leave errored rollouts out before calling.
        advantages: (B,), one per trajectory; or per trajectory, one number or a list of
        one per sampled token (on-policy distillation), which makes the batch's (B, T).
        """
        if len(advantages) != len(trajectories):
            raise ValueError(
                f"need one advantage per trajectory: {len(trajectories)} trajectories, "
                f"{len(advantages)} advantages"
            )
        if not trajectories:
            raise ValueError("cannot build a batch from no trajectories")
        for trajectory in trajectories:
            _check(trajectory)

        batch = cls._padded(
            [t.token_ids for t in trajectories], [t.loss_mask for t in trajectories]
        )
        behaviour = torch.zeros(batch.target_mask.shape, dtype=torch.float32)  # (B, T)
        for row, trajectory in enumerate(trajectories):
            behaviour[row][batch.target_mask[row]] = torch.tensor(trajectory.logprobs)
        per_token = not isinstance(advantages, Tensor) and any(
            isinstance(a, Sequence) for a in advantages
        )
        if per_token:
            values = _token_advantages(trajectories, advantages, batch.target_mask)  # (B, T)
        else:
            values = torch.as_tensor(advantages, dtype=torch.float32)  # (B,)
            if values.shape != (len(trajectories),):
                raise ValueError(f"advantages of shape {tuple(values.shape)}: need (B,)")
            values = values.unsqueeze(-1)  # (B, 1)
        if not torch.isfinite(values).all():
            raise ValueError(f"advantages must be finite, got {values.tolist()}")
        return replace(batch, behaviour_logprobs=behaviour, advantages=values)

    @classmethod
    def from_sequences(
        cls, token_ids: Sequence[list[int]], loss_masks: Sequence[list[int]]
    ) -> TrainBatch:
        """Pad and shift token sequences that no policy sampled here, so there are no
        behaviour log-probs or advantages to hold. Raises ValueError on inconsistent rows."""
        if len(token_ids) != len(loss_masks):
            raise ValueError(f"{len(token_ids)} sequences but {len(loss_masks)} loss masks")
        if not token_ids:
            raise ValueError("cannot build a batch from no sequences")
        for row, (tokens, mask) in enumerate(zip(token_ids, loss_masks, strict=True)):
            _check_tokens(f"sequence {row}", tokens, mask)
        return cls._padded(token_ids, loss_masks)

    @classmethod
    def _padded(cls, token_ids: Sequence[list[int]], loss_masks: Sequence[list[int]]) -> TrainBatch:
        rows, width = len(token_ids), max(len(tokens) for tokens in token_ids)
        input_ids = torch.zeros(rows, width, dtype=torch.long)  # (B, T)
        attention_mask = torch.zeros(rows, width, dtype=torch.long)  # (B, T)
        target_mask = torch.zeros(rows, width, dtype=torch.bool)  # (B, T)
        for row, (tokens, mask) in enumerate(zip(token_ids, loss_masks, strict=True)):
            n = len(tokens)
            input_ids[row, :n] = torch.tensor(tokens)
            attention_mask[row, :n] = 1
            target_mask[row, : n - 1] = torch.tensor(mask[1:], dtype=torch.bool)  # (n - 1,)
        targets = torch.zeros_like(input_ids)  # (B, T)
        targets[:, :-1] = input_ids[:, 1:]  # padding ids are 0, so "none" is 0 too
        return cls(
            input_ids=input_ids,
            attention_mask=attention_mask,
            target_mask=target_mask,
            targets=targets,
        )

    @property
    def lengths(self) -> list[int]:
        """Real tokens per row."""
        return self.attention_mask.sum(dim=-1).tolist()

    @property
    def shared_prefix(self) -> int:
        """Leading columns that hold the same tokens in every row and predict no sampled
        token in any: a group's prompt, or the system prompt of several. Their keys and
        values can be computed once for all rows (`logprobs.selective_logprobs`), and
        nothing trained needs their outputs. 0 for one row, and every row keeps at least
        one column of its own."""
        if self.input_ids.shape[0] == 1:
            return 0
        alike = (self.input_ids == self.input_ids[:1]).all(dim=0)  # (T,)
        untrained = ~self.target_mask.any(dim=0)  # (T,)
        leading = int((alike & untrained).int().cumprod(dim=0).sum())
        return max(0, min(leading, min(self.lengths) - 1))

    def computed_tokens(self, share_prefix: bool) -> int:
        """Token positions a forward of this batch runs: rows x width, or with
        `share_prefix` the shared prefix once and each row's rest. What `micro_batches`
        budgets, since activations grow with it."""
        rows, width = self.input_ids.shape
        shared = self.shared_prefix if share_prefix else 0
        return shared + rows * (width - shared)

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
        return self._map(lambda tensor: tensor[index, :width])

    def to(self, device: torch.device | str) -> TrainBatch:
        """Every tensor on `device`."""
        return self._map(lambda tensor: tensor.to(device))

    def _map(self, change: Callable[[Tensor], Tensor]) -> TrainBatch:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return TrainBatch(**{k: None if v is None else change(v) for k, v in values.items()})


def _token_advantages(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[float | Sequence[float]] | Tensor,
    target_mask: Tensor,
) -> Tensor:
    """(B, T): each trajectory's advantages at the positions predicting its sampled
    tokens, a single number spread over all of them; 0 elsewhere."""
    values = torch.zeros(target_mask.shape, dtype=torch.float32)  # (B, T)
    for row, (trajectory, advantage) in enumerate(zip(trajectories, advantages, strict=True)):
        sampled = trajectory.completion_tokens
        tokens = advantage if isinstance(advantage, Sequence) else [float(advantage)] * sampled
        if len(tokens) != sampled:
            raise ValueError(
                f"trajectory {trajectory.task_id}/{trajectory.group_id}#{trajectory.index}: "
                f"{len(tokens)} advantages for {sampled} sampled tokens"
            )
        values[row][target_mask[row]] = torch.tensor(tokens, dtype=torch.float32)
    return values


def _check(trajectory: Trajectory) -> None:
    """Raise ValueError naming the trajectory if its tokens, mask and log-probs disagree."""
    name = f"trajectory {trajectory.task_id}/{trajectory.group_id}#{trajectory.index}"
    _check_tokens(name, trajectory.token_ids, trajectory.loss_mask)
    mask = trajectory.loss_mask
    if sum(mask) != len(trajectory.logprobs):
        raise ValueError(
            f"{name}: {sum(mask)} sampled tokens (loss_mask) but "
            f"{len(trajectory.logprobs)} logprobs; they must be one per sampled token"
        )
    if not all(math.isfinite(lp) for lp in trajectory.logprobs):
        raise ValueError(f"{name}: a sampled token's logprob is not finite")


def _check_tokens(name: str, tokens: list[int], mask: list[int]) -> None:
    """Raise ValueError naming the row if its tokens and mask disagree."""
    if not tokens:
        raise ValueError(f"{name} has no tokens")
    if len(mask) != len(tokens):
        raise ValueError(f"{name}: {len(tokens)} token_ids but {len(mask)} loss_mask entries")
    if any(m not in (0, 1) for m in mask):
        raise ValueError(f"{name}: loss_mask must hold only 0 and 1")
    if mask[0]:
        raise ValueError(f"{name}: the first token is marked sampled, but nothing predicts it")
    if min(tokens) < 0:
        raise ValueError(f"{name}: token ids must not be negative")


def micro_batches(
    batch: TrainBatch, token_budget: int, share_prefix: bool = True
) -> list[list[int]]:
    """Row indices grouped so that each group computes at most token_budget tokens
    (`TrainBatch.computed_tokens`); a row over the budget gets a group of its own.

    Rows are taken in one of two orders, and a group closes when the next row would break
    the budget: longest first (ties by index), so each group holds rows of similar length
    and pads little; or, with `share_prefix`, by their tokens up to the first sampled one
    (then longest first), so the rollouts of one prompt sit together and their shared
    prefix runs once. Of the two plans the one that computes fewer tokens in all is taken,
    the length order on a tie. Deterministic.

    Returns the groups, each in its order.
    """
    if token_budget <= 0:
        raise ValueError(f"token_budget must be positive, got {token_budget}")
    lengths = batch.lengths
    by_length = sorted(range(len(lengths)), key=lambda row: (-lengths[row], row))
    plans = [_greedy(batch, by_length, token_budget, share_prefix)]
    if share_prefix:
        opening = [_opening(batch, row) for row in range(len(lengths))]
        by_prompt = sorted(by_length, key=lambda row: opening[row])  # stable: longest first
        plans.append(_greedy(batch, by_prompt, token_budget, share_prefix))
    costs = [
        sum(batch.select(rows).computed_tokens(share_prefix) for rows in plan) for plan in plans
    ]
    return plans[costs.index(min(costs))]


def _greedy(
    batch: TrainBatch, order: list[int], token_budget: int, share_prefix: bool
) -> list[list[int]]:
    """`order` cut into consecutive groups, each as long as the budget allows."""
    groups: list[list[int]] = []
    for row in order:
        if groups:
            grown = groups[-1] + [row]
            if batch.select(grown).computed_tokens(share_prefix) <= token_budget:
                groups[-1] = grown
                continue
        groups.append([row])
    return groups


def _opening(batch: TrainBatch, row: int) -> list[int]:
    """The row's tokens up to the first one its policy sampled: its prompt."""
    targets = batch.target_mask[row].nonzero()
    end = int(targets[0]) + 1 if len(targets) else batch.lengths[row]
    return batch.input_ids[row, :end].tolist()
