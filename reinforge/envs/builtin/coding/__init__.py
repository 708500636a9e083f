"""`coding`: small Python tasks in Harbor format, bundled with the package.

Each task directory under `tasks/` has an instruction, a Dockerfile that the local
backend replays (FROM, WORKDIR, COPY), hidden tests run after the agent phase and a
reference solution (`--agent oracle`). The tiers are in each task.toml's
`[metadata] difficulty`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reinforge.envs.environment import Environment
from reinforge.envs.harbor import load_environment as load_harbor

TASKS = Path(__file__).parent / "tasks"


def load_environment(**kwargs: Any) -> Environment:
    return load_harbor(TASKS, name="coding", **kwargs)
