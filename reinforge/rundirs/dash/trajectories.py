"""A file of trajectories as the viewer shows it: a row per rollout with the advantage it
trained with, and one rollout with each token's text beside its loss mask, log-prob and
policy version."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from transformers import PreTrainedTokenizerBase

from reinforge.errors import UsageError, first_problem
from reinforge.policy.models import load_tokenizer
from reinforge.train.config import TrainerConfig
from reinforge.train.trainer import select_for_training
from reinforge.types import Group, Task, Trajectory


def read(path: Path) -> list[Trajectory]:
    """The complete lines of `path`: an eval or a step being written may end mid-line."""
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]
    return [Trajectory.model_validate_json(line) for line in lines if line.strip()]


def advantages(
    trajectories: list[Trajectory], trainer: dict[str, Any] | None
) -> tuple[list[float | None], str | None]:
    """The advantage each rollout trained with, computed as the trainer did (the same
    `select_for_training` on the run's trainer config); None for one left out (errored,
    its group's rewards all equal, a masked truncation). With the reason when there are
    none: an eval trains nothing, and a config this version cannot read has no algorithm."""
    if trainer is None:
        return [None] * len(trajectories), "an eval trains nothing"
    try:
        config = TrainerConfig.model_validate(trainer)
    except ValidationError as error:
        where, problem = first_problem(error)
        key = f"trainer.{where}" if where else "trainer"  # "": the section's own rule
        return [None] * len(trajectories), f"the run's {key}: {problem}"
    groups: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        groups.setdefault(trajectory.group_id, []).append(trajectory)
    selection = select_for_training(
        [Group(task=Task(id=g[0].task_id, prompt=[]), trajectories=g) for g in groups.values()],
        config,
    )
    trained = {id(t): a for t, a in zip(selection.trajectories, selection.advantages, strict=True)}
    return [trained.get(id(t)) for t in trajectories], None


def row(line: int, trajectory: Trajectory, advantage: float | None) -> dict[str, Any]:
    """What the list shows and filters on, without the tokens."""
    versions = trajectory.policy_versions
    return {
        "line": line,
        "task_id": trajectory.task_id,
        "group_id": trajectory.group_id,
        "index": trajectory.index,
        "reward": trajectory.reward,
        "rewards": trajectory.rewards,
        "status": trajectory.status.value,
        "error": trajectory.error,
        "turns": trajectory.turns,
        "sampled_tokens": trajectory.completion_tokens,
        "tokens": len(trajectory.token_ids),
        "advantage": advantage,
        "versions": [min(versions), max(versions)] if versions else None,
    }


def detail(
    trajectory: Trajectory, advantage: float | None, tokenizer: PreTrainedTokenizerBase | None
) -> dict[str, Any]:
    """The whole trajectory, its advantage, and the text of each token (None without a
    tokenizer: the viewer then shows the messages)."""
    texts = None
    if tokenizer is not None:
        texts = [tokenizer.decode([token]) for token in trajectory.token_ids]
    return {**trajectory.model_dump(mode="json"), "advantage": advantage, "token_texts": texts}


def tokenizer_for(model: str | None, checkpoints: Path) -> PreTrainedTokenizerBase | None:
    """The run's tokenizer: its model's (a built-in name or a folder), else the one saved
    with its newest checkpoint; None when neither loads (an eval of a model behind a URL)."""
    candidates = [model] if model else []
    candidates += [str(path) for path in sorted(checkpoints.glob("step_*"), reverse=True)]
    for candidate in candidates:
        if (tokenizer := _load(candidate)) is not None:
            return tokenizer
    return None


@functools.cache
def _load(spec: str) -> PreTrainedTokenizerBase | None:
    try:
        return load_tokenizer(spec)
    except (UsageError, OSError, ValueError):
        return None
