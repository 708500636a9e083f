"""The environment's config section: which environment, its loader's arguments, and the
per-turn limits of its harness, which every environment has and runs change most often.
What a run adds to any environment (reasoning levels, harness augmentation, a loop penalty,
judged criteria, a conciseness bonus) extends it in the recipes annex, which imports this
module (never the reverse)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pydantic import Field

from reinforge.types import Section

if TYPE_CHECKING:
    from reinforge.envs.environment import Environment

HARNESS_LIMITS = ("max_turns", "max_tokens_per_turn")
"""The keys of `EnvConfig` that replace a field of the same name of the loaded
environment's harness: set here for every environment, never among a loader's arguments."""


class EnvConfig(Section):
    name: str = "arithmetic"
    """Built-in or installed name, path/to/env.py, or module:function."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the environment's loader: its `Args` when it declares them, else its
    keyword arguments."""
    max_turns: int | None = Field(None, ge=1)
    """Turns the policy may take per episode; None keeps the environment's harness value."""
    max_tokens_per_turn: int | None = Field(None, ge=1)
    """Tokens the policy may sample per turn; None keeps the environment's harness value."""

    def apply(self, environment: Environment) -> None:
        """Change the loaded `environment` as the section asks: its per-turn limits. A
        section that asks for more extends it, so that `registry.load_configured` stays the
        one place a run's settings change an environment."""
        given = {
            key: getattr(self, key) for key in HARNESS_LIMITS if getattr(self, key) is not None
        }
        if given:
            environment.harness = replace(environment.harness, **given)
