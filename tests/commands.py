"""The `reinforge` command run as a user runs it: a subprocess from the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LENGTH_ENV = str(ROOT / "tests" / "data" / "length_env.py")
"""A test environment whose reward is the completion's length: groups always differ."""


def reinforge(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reinforge", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )


def tiny_train(run_dir: Path, *overrides: str) -> list[str]:
    """argv of a short `reinforge train` of the tiny model on `LENGTH_ENV`, writing
    `run_dir/r`; later overrides win over these defaults."""
    return [
        sys.executable,
        "-m",
        "reinforge",
        "train",
        "model.name=tiny-random",
        f"env.name={LENGTH_ENV}",
        "run.steps=2",
        f"run.dir={run_dir}",
        "run.name=r",
        "rollout.tasks_per_step=2",
        *overrides,
    ]
