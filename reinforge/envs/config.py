"""The environment's config section: which environment, its loader's arguments, the one
knob on its harness that runs change most often, and what a run adds to any environment
(reasoning levels, harness augmentation, a loop penalty, judged criteria, a conciseness
bonus: `recipes.py`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from reinforge.envs.augment import HarnessAugmentation
from reinforge.envs.judge import JudgeConfig
from reinforge.envs.levels import ReasoningLevels
from reinforge.types import Section


class EnvConfig(Section):
    name: str = "arithmetic"
    """Built-in or installed name, path/to/env.py, or module:function."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the environment's loader."""
    max_tokens_per_turn: int | None = Field(None, ge=1)
    """Tokens the policy may sample per turn; None keeps the environment's harness value."""
    levels: ReasoningLevels | None = None
    """An episode over its budget scores `over_budget_reward` whatever its answer (rubric
    term `over_budget`). docs/recipes.md."""
    augment: HarnessAugmentation | None = None
    """Vary the harness per rollout (system prompt, tool names, descriptions and order,
    notes, tool-call format, a sub-agent tool); None: every rollout meets the environment's
    harness. docs/recipes.md."""
    loop_penalty: float = Field(0.0, ge=0.0)
    """Subtracted from the reward of an episode with a looping turn (rubric term
    `looping`); 0: no term. Loop rates are reported either way."""
    judge: JudgeConfig | None = None
    """Each criterion is a rubric term under its own name; a verdict that fails makes the
    rollout an error. docs/recipes.md."""
    conciseness: float = Field(0.0, ge=0.0)
    """Weight of a bonus from +0.5 for the group's shortest episode to -0.5 for its longest
    (rubric term `conciseness`); keep it below the reward gap between a right and a wrong
    answer. 0: no term."""
