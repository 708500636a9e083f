"""SFT warm-up from stored trajectories: the batches, masks and trainer of RL, another loss.

A trajectory whose token record this model's tokenizer wrote trains on exactly those tokens
and that loss mask, never re-tokenized (DESIGN.md, principle 1). One that holds only
messages (from another OpenAI-compatible server), or another vocabulary's tokens, is
rendered with the model's chat template one prefix at a time, and each assistant turn
trains through the end-of-turn token the model must learn to emit. Each prefix's tokens
must begin the next prefix's, so the rendering is the token sequence a reinforge episode of
the same conversation would record; a conversation the template cannot render that way is
an error that names the trajectory.
"""

from __future__ import annotations

import functools
import json
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from transformers import PreTrainedTokenizerBase

from reinforge.config import Config, SFTConfig
from reinforge.errors import UsageError
from reinforge.policy.chat import ChatFormat, TemplateError
from reinforge.rollout.checks import masked_spans
from reinforge.train.batching import TrainBatch
from reinforge.train.checkpoints import (
    latest_checkpoint,
    load_trainer_state,
    open_run,
    write_checkpoint,
)
from reinforge.train.config import PPOClipLoss, SFTLoss
from reinforge.train.trainable import load_trainable
from reinforge.train.trainer import Trainer
from reinforge.types import Message, Status, Trajectory


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
    """The examples of the trajectories that pass the filters. Raises UsageError when a file
    is missing or malformed, a trajectory cannot be rendered, or nothing is kept."""
    if not config.data:
        raise UsageError("sft.data is empty: name trajectory files or folders")
    files = trajectory_files(config.data)
    records = [record for path in files for record in _read(path)]
    kept = [(name, t) for name, t in records if _passes(t, config)]
    if not kept:
        where = ", ".join(str(p) for p in config.data)
        raise UsageError(
            f"no trajectories with {_filters(config)} in {where}: 0 of {len(records)} kept"
        )
    chat = functools.cache(lambda: _chat_format(tokenizer))  # only rendering needs it
    examples = [to_example(name, t, tokenizer, chat) for name, t in kept]
    return SFTData(examples, read=len(records), files=files)


def trajectory_files(paths: Sequence[Path]) -> list[Path]:
    """Each path as JSONL files: itself, an eval output's trajectories.jsonl, or a training
    run's trajectories/*.jsonl."""
    files: list[Path] = []
    for path in paths:
        if path.is_file():
            files.append(path)
        elif (path / "trajectories.jsonl").is_file():
            files.append(path / "trajectories.jsonl")
        elif steps := sorted((path / "trajectories").glob("*.jsonl")):
            files.extend(steps)
        elif path.is_dir():
            raise UsageError(f"{path} holds neither trajectories.jsonl nor trajectories/*.jsonl")
        else:
            raise UsageError(f"no such file or folder: {path}")
    return files


def _read(path: Path) -> Iterator[tuple[str, Trajectory]]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                trajectory = Trajectory.model_validate_json(line)
            except ValidationError as error:
                first = error.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                problem = f"{where}: {first['msg']}" if where else first["msg"]
                raise UsageError(f"{path}:{number} is not a trajectory: {problem}") from error
            name = f"trajectory {trajectory.task_id}#{trajectory.index} ({path}:{number})"
            yield name, trajectory


def _passes(trajectory: Trajectory, config: SFTConfig) -> bool:
    if trajectory.status not in config.statuses:
        return False
    return config.min_reward is None or trajectory.reward >= config.min_reward


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
        if _is_own_record(trajectory, tokenizer):
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


def _is_own_record(trajectory: Trajectory, tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether this tokenizer wrote the token record: each sampled span decodes to its
    assistant message (less a final EOS token). A record from a server of another model,
    in another vocabulary, does not, and is rendered from its messages instead."""
    ids = trajectory.token_ids
    if max(ids) >= len(tokenizer):
        return False
    texts = [m.get("content") or "" for m in trajectory.messages if m.get("role") == "assistant"]
    spans = masked_spans(trajectory.loss_mask)
    if len(spans) != len(texts):
        return False
    for (start, end), text in zip(spans, texts, strict=True):
        sampled = ids[start:end]
        if sampled[-1] == tokenizer.eos_token_id:
            sampled = sampled[:-1]
        if tokenizer.decode(sampled) != text:
            return False
    return True


def render_messages(
    messages: list[Message],
    chat: ChatFormat,
    tools: Sequence[dict] | None = None,
    last_turn_ended: bool = True,
) -> tuple[list[int], list[int]]:
    """(token_ids, loss_mask) of a conversation, as a reinforge episode would record it.

    Each assistant turn trains its content and the first token of the template's assistant
    suffix (the end-of-turn token, e.g. `<|im_end|>`); the rest of the suffix and every other
    message is context. The sequence ends at the last assistant turn's end-of-turn token, where
    a recorded episode ends. `last_turn_ended=False` (a truncated episode, which may have been
    cut mid-answer) leaves that last end-of-turn token out.

    `tools` are the tool schemas the policy was offered (`Trajectory.tools`).
    Raises TemplateError when a rendered prefix does not begin the next one.
    """
    tokenizer = chat.tokenizer
    messages = [_with_tool_markup(m) for m in messages] if not chat.native_tools else messages
    suffix = tokenizer.encode(chat.assistant_suffix, add_special_tokens=False)  # e.g. [eot, \n]
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not turns:
        raise TemplateError("no assistant message to learn from")
    ids: list[int] = []
    mask: list[int] = []
    for turn in turns:
        _extend(ids, mask, chat.prompt_ids(messages[:turn], tools), trained=False)
        closed = chat.render_text(messages[: turn + 1], tools)
        closed_ids = tokenizer.encode(closed, add_special_tokens=False)
        if not suffix or closed_ids[-len(suffix) :] != suffix:
            raise TemplateError(
                f"assistant turn {turns.index(turn)} does not end with the template's "
                f"assistant suffix {chat.assistant_suffix!r}"
            )
        ended = last_turn_ended or turn != turns[-1]
        through = len(closed_ids) - len(suffix) + int(ended)  # content (+ end-of-turn)
        _extend(ids, mask, closed_ids[:through], trained=True)
    return ids, mask


def _extend(ids: list[int], mask: list[int], rendered: list[int], trained: bool) -> None:
    """Append what `rendered` adds after `ids`, which it must begin with."""
    if rendered[: len(ids)] != ids:
        at = next(
            (i for i, (a, b) in enumerate(zip(ids, rendered, strict=False)) if a != b),
            len(rendered),
        )
        raise TemplateError(
            f"rendering one more message changes the tokens before it (at token {at}), so "
            "the conversation has no exact token sequence with this chat template"
        )
    added = rendered[len(ids) :]
    ids.extend(added)
    mask.extend([int(trained)] * len(added))


def _with_tool_markup(message: Message) -> Message:
    """A server that parses tool calls returns them beside the text, not in it. Templates
    without native tools would drop them, so they are written back as the `<tool_call>`
    blocks of the tool system prompt, which is what a reinforge-produced message holds."""
    calls = message.get("tool_calls")
    content = message.get("content") or ""
    if not calls or "<tool_call>" in content:
        return message
    blocks = [
        f'<tool_call>\n{{"name": {json.dumps(c["function"]["name"])}, '
        f'"arguments": {c["function"].get("arguments") or "{}"}}}\n</tool_call>'
        for c in calls
    ]
    return {**message, "content": "\n".join([content, *blocks] if content else blocks)}


def train_batch(examples: Sequence[Example]) -> TrainBatch:
    """The batch RL trains on. The SFT loss reads neither advantages nor behaviour
    log-probs, so zeros fill the places the batch keeps for them."""
    trajectories = [
        Trajectory(
            task_id=e.name,
            group_id=e.name,
            token_ids=e.token_ids,
            loss_mask=e.loss_mask,
            logprobs=[0.0] * sum(e.loss_mask),
        )
        for e in examples
    ]
    return TrainBatch.from_trajectories(trajectories, [0.0] * len(trajectories))


def epoch_batches(count: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Example indices, shuffled by (seed, epoch) and cut into batches; the last may be
    smaller. The same seed gives the same order in every run."""
    order = list(range(count))
    random.Random(f"{seed}/{epoch}").shuffle(order)
    return [order[start : start + batch_size] for start in range(0, count, batch_size)]


# ---- the loop ---------------------------------------------------------------------------


def sft_config(config: Config, examples: int) -> Config:
    """The config as SFT runs it: the SFT loss with the configured aggregation, and
    `run.steps` derived from the data. Raises UsageError on RL-only loss settings."""
    loss = config.trainer.algorithm.loss
    if isinstance(loss, PPOClipLoss) and loss.model_fields_set - {"kind", "aggregation"}:
        raise UsageError(
            "sft trains with the SFT loss: of trainer.algorithm.loss only aggregation applies"
        )
    algorithm = config.trainer.algorithm.model_copy(
        update={"loss": SFTLoss(aggregation=loss.aggregation)}
    )
    steps = config.sft.epochs * math.ceil(examples / config.sft.batch_size)
    return config.model_copy(
        update={
            "trainer": config.trainer.model_copy(update={"algorithm": algorithm}),
            "run": config.run.model_copy(update={"steps": steps}),
        }
    )


def train_sft(
    config: Config,
    examples: list[Example],
    on_step: Callable[[dict[str, Any]], None],
    resume: bool = False,
) -> Path:
    """Train `config.sft.epochs` epochs over `examples` (config from `sft_config`), or what
    is left of them after the run's last checkpoint; returns the run directory."""
    run_dir = config.run_dir
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if resume and checkpoint is None:
        raise UsageError(f"nothing to resume: no checkpoint in {run_dir}")
    torch.manual_seed(config.run.seed)  # LoRA's initial adapters
    model, tokenizer = load_trainable(config.model.name, config.trainer, checkpoint)
    trainer = Trainer(model, config.trainer, config.optim, total_steps=config.run.steps)
    start = 0
    if checkpoint is not None:
        state = load_trainer_state(checkpoint)
        if state["examples"] != len(examples):
            raise UsageError(
                f"cannot resume {run_dir}: it trained on {state['examples']} examples, "
                f"the data now gives {len(examples)}"
            )
        trainer.load_state_dict(state)
        start = state["step"]
    schedule = [
        (epoch, rows)
        for epoch in range(config.sft.epochs)
        for rows in epoch_batches(len(examples), config.sft.batch_size, config.run.seed, epoch)
    ]
    with open_run(run_dir, config.model_dump_json(indent=2), start) as metrics_file:
        for step in range(start, len(schedule)):
            epoch, rows = schedule[step]
            started = time.perf_counter()
            trained = trainer.step(train_batch([examples[row] for row in rows]))
            metrics = _step_metrics(step, epoch, len(rows), trained, started)
            metrics_file.write(json.dumps(metrics) + "\n")
            metrics_file.flush()
            done = step + 1
            if done % config.run.checkpoint_every == 0 or done == len(schedule):
                state = {"step": done, "examples": len(examples), **trainer.state_dict()}
                write_checkpoint(run_dir, done, model, tokenizer, state)
            on_step(metrics)
    return run_dir


def _step_metrics(
    step: int, epoch: int, sequences: int, trained: dict[str, float], started: float
) -> dict[str, Any]:
    seconds = time.perf_counter() - started
    return {
        "step": step,
        "epoch": epoch,
        "sequences": sequences,
        **trained,
        "time_s": seconds,
        "tokens_per_s": trained["trained_tokens"] / seconds,
    }
