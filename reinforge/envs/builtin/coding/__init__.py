"""`coding`: small Python tasks in Harbor format, bundled with the package.

Each task directory under `tasks/` has an instruction, a Dockerfile that the local
backend replays (FROM, WORKDIR, COPY), hidden tests run after the agent phase and a
reference solution (`--agent oracle`). The tiers are in each task.toml's
`[metadata] difficulty`. `generated` adds that many generated easy tasks
(`generated.py`) to the train split, of the `generated_kinds` named (all by default).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

from reinforge.envs.builtin.coding.generated import KINDS, generate
from reinforge.envs.environment import Environment
from reinforge.envs.harbor import load_environment as load_harbor
from reinforge.errors import UsageError

TASKS = Path(__file__).parent / "tasks"


def load_environment(
    generated: int = 0,
    generated_seed: int = 0,
    generated_kinds: list[str] | None = None,
    **kwargs: Any,
) -> Environment:
    """`generated_kinds` narrows the generated tasks to some kinds: to measure a policy
    on one kind, or to train on it. GRPO on the kinds the warm-up fails most forgot the
    others (README, "What did not work"), so the agentic job draws them all."""
    if generated < 0:
        raise UsageError(f"generated {generated}: must be 0 or more")
    kinds = list(KINDS) if generated_kinds is None else generated_kinds
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise UsageError(f"generated_kinds {kinds}: name one or more of {', '.join(KINDS)}")
    if generated and kwargs.get("split") == "test":
        raise UsageError(
            "generated tasks only join the train split; the test split is the written tasks"
        )
    train_only: list[Path] = []
    if generated:
        root = Path(tempfile.mkdtemp(prefix="reinforge-coding-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        train_only = generate(generated, generated_seed, root, kinds)
    return load_harbor(TASKS, name="coding", train_only=train_only, **kwargs)
