"""The environment's config section: which environment, its loader's arguments, and the
one knob on its harness that runs change most often."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from reinforge.types import Section


class EnvConfig(Section):
    name: str = "arithmetic"
    """Built-in or installed name, path/to/env.py, or module:function."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the environment's loader."""
    max_tokens_per_turn: int | None = Field(None, ge=1)
    """Tokens the policy may sample per turn; None keeps the environment's harness value."""
