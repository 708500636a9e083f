"""The orchestrator's config section: the run directory, its length and its cadence."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from reinforge.types import Section


class RunConfig(Section):
    name: str = "run"
    """The run directory is `<dir>/<name>`."""
    dir: Path = Path("runs")
    """Where run directories are made."""
    steps: int = Field(20, ge=1)
    """Optimizer steps of the run (SFT derives its own from the data)."""
    seed: int = 0
    """Seeds task order and sampling."""
    checkpoint_every: int = Field(10, ge=1)
    """Steps between checkpoints; the last step always writes one."""
