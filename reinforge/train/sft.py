"""SFT warm-up from stored trajectories: the batches, masks and trainer of RL, another loss.

A trajectory whose token record this model's tokenizer wrote trains on exactly those tokens
and that loss mask, never re-tokenized (re-tokenized text can differ from what was
sampled, and training must condition on exactly what the policy saw). One that holds only
messages (from another OpenAI-compatible server), or another vocabulary's tokens, is
rendered with the model's chat template as a reinforge episode of the same conversation
would record it (`policy.records.render_messages`), each assistant turn trained through the
end-of-turn token the model must learn to emit; a conversation the template cannot render
that way is an error that names the trajectory.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from reinforge.errors import UsageError
from reinforge.policy.chat import ChatFormat, TemplateError
from reinforge.policy.records import is_own_record, render_messages
from reinforge.rollout.store import iter_trajectories, trajectory_files
from reinforge.train.batching import TrainBatch
from reinforge.train.config import SFTConfig
from reinforge.types import Status, Trajectory


@dataclass(frozen=True)
class Example:
    """One training sequence: tokens, and 1 on the tokens the model learns to produce."""

    name: str
    """The trajectory and where it was read, for error messages."""
    token_ids: list[int]
    loss_mask: list[int]
    rendered: bool
    """Built from the messages, not taken from a token record."""


@dataclass(frozen=True)
class SFTData:
    examples: list[Example]
    read: int
    """Trajectories read, before the filters."""
    files: list[Path]

    @property
    def rendered(self) -> int:
        return sum(example.rendered for example in self.examples)


# ---- data -------------------------------------------------------------------------------


def load_data(config: SFTConfig, tokenizer: PreTrainedTokenizerBase) -> SFTData:
    """The examples of the trajectories that pass the filters, in the order of their task,
    group and index: an eval writes its rollouts as they finish, and the seeded shuffle of
    the same data in another order would give another warm-up. Raises UsageError when a
    file is missing or malformed, a trajectory cannot be rendered, or nothing is kept."""
    if not config.data:
        raise UsageError("sft.data is empty: name trajectory files or folders")
    files = [file for path in config.data for file in trajectory_files(path)]
    records = [
        (f"trajectory {t.task_id}#{t.index} ({where})", t)
        for file in files
        for where, t in iter_trajectories(file)
    ]
    records.sort(key=lambda record: (record[1].task_id, record[1].group_id, record[1].index))
    kept = [(name, t) for name, t in records if _passes(t, config)]
    if not kept:
        where = ", ".join(str(p) for p in config.data)
        raise UsageError(
            f"no trajectories with {_filters(config)} in {where}: 0 of {len(records)} kept"
        )
    chat = functools.cache(lambda: _chat_format(tokenizer))  # only rendering needs it
    examples = [to_example(name, t, tokenizer, chat) for name, t in kept]
    return SFTData(examples, read=len(records), files=files)


def _passes(trajectory: Trajectory, config: SFTConfig) -> bool:
    if trajectory.status not in config.statuses:
        return False
    if config.min_reward is None:
        return True
    return trajectory.reward is not None and trajectory.reward >= config.min_reward


def _filters(config: SFTConfig) -> str:
    statuses = " or ".join(config.statuses)
    if config.min_reward is None:
        return f"status {statuses}"
    return f"status {statuses} and reward >= {config.min_reward}"


def _chat_format(tokenizer: PreTrainedTokenizerBase) -> ChatFormat:
    try:
        return ChatFormat(tokenizer)
    except TemplateError as error:
        raise UsageError(f"rendering messages needs a chat template: {error}") from error


def to_example(
    name: str,
    trajectory: Trajectory,
    tokenizer: PreTrainedTokenizerBase,
    chat: Callable[[], ChatFormat],
) -> Example:
    """The trajectory's own tokens and mask when they are this tokenizer's; else its
    messages rendered with the chat template."""
    if trajectory.token_ids:
        _check_record(name, trajectory)
        if is_own_record(trajectory, tokenizer):
            return Example(name, trajectory.token_ids, trajectory.loss_mask, rendered=False)
    try:
        ids, mask = render_messages(
            trajectory.messages,
            chat(),
            trajectory.tools,
            last_turn_ended=trajectory.status is not Status.TRUNCATED,
        )
    except TemplateError as error:
        raise UsageError(f"{name}: {error}") from error
    if not any(mask):
        raise UsageError(f"{name}: no assistant tokens to learn from")
    return Example(name, ids, mask, rendered=True)


def _check_record(name: str, trajectory: Trajectory) -> None:
    ids, mask = trajectory.token_ids, trajectory.loss_mask
    if len(mask) != len(ids) or set(mask) - {0, 1} or mask[0] or not any(mask):
        raise UsageError(
            f"{name}: loss_mask must hold one 0 or 1 per token id, 0 on the first, and 1 somewhere"
        )


def train_batch(examples: Sequence[Example]) -> TrainBatch:
    """The batch the trainer steps on: tokens and masks only, which is all the SFT loss
    reads."""
    return TrainBatch.from_sequences(
        [e.token_ids for e in examples], [e.loss_mask for e in examples]
    )


def epoch_batches(count: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Example indices, shuffled by (seed, epoch) and cut into batches; the last may be
    smaller. The same seed gives the same order in every run."""
    order = list(range(count))
    random.Random(f"{seed}/{epoch}").shuffle(order)
    return [order[start : start + batch_size] for start in range(0, count, batch_size)]


def schedule(count: int, config: SFTConfig, seed: int) -> list[tuple[int, list[int]]]:
    """(epoch, example indices) of every step, in order: the run's steps are its length."""
    return [
        (epoch, rows)
        for epoch in range(config.epochs)
        for rows in epoch_batches(count, config.batch_size, seed, epoch)
    ]
