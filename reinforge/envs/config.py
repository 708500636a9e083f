"""The environment's config section: which environment, its loader's arguments, and the one
knob on its harness that runs change most often. What a run adds to any environment
(reasoning levels, harness augmentation, a loop penalty, judged criteria, a conciseness
bonus) extends it in `reinforge/envs/recipes/config.py`."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pydantic import Field

from reinforge.types import Section

if TYPE_CHECKING:
    from reinforge.envs.environment import Environment


class EnvConfig(Section):
    name: str = "arithmetic"
    """Built-in or installed name, path/to/env.py, or module:function."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the environment's loader."""
    max_tokens_per_turn: int | None = Field(None, ge=1)
    """Tokens the policy may sample per turn; None keeps the environment's harness value."""

    def apply(self, environment: Environment) -> None:
        """Change the loaded `environment` as the section asks: its per-turn token limit. A
        section that asks for more extends it, so that `registry.load_configured` stays the
        one place a run's settings change an environment."""
        if self.max_tokens_per_turn is not None:
            environment.harness = replace(
                environment.harness, max_tokens_per_turn=self.max_tokens_per_turn
            )
