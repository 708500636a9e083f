"""`coding`: small Python tasks in Harbor format, bundled with the package.

Each task directory under `tasks/` has an instruction, a Dockerfile that the local
backend replays (FROM, WORKDIR, COPY), hidden tests run after the agent phase and a
reference solution (`--agent oracle`). The tiers are in each task.toml's
`[metadata] difficulty`. `generated` adds that many generated easy tasks
(`generated/`) to the train split, of the `generated_kinds` named (all by default);
`generated_only` leaves the written tasks out.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from reinforge.envs.builtin.coding.generated import KINDS, generate, named
from reinforge.envs.environment import Environment
from reinforge.envs.harbor.environment import load_environment as load_harbor
from reinforge.errors import UsageError

TASKS = Path(__file__).parent / "tasks"


def load_environment(
    generated: int = 0,
    generated_seed: int = 0,
    generated_kinds: list[str] | None = None,
    generated_only: bool = False,
    **kwargs: Any,
) -> Environment:
    """`generated_kinds` narrows the generated tasks to some kinds: to measure a policy
    on one kind, or to train on it. GRPO on the kinds the warm-up fails most forgot the
    others (docs/coding-job.md, "What did not work"), so the agentic job draws them all.

    `generated_only` measures a policy on its training distribution: generated tasks
    drawn with a `generated_seed` that training did not use are unseen tasks of the
    kinds it trained on, where the written test split measures how far that carries."""
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
    if not generated:
        if generated_only:
            raise UsageError("generated_only leaves only the generated tasks: set generated > 0")
        return load_harbor(TASKS, name="coding", **kwargs)
    root = Path(tempfile.mkdtemp(prefix="reinforge-coding-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    paths = generate(generated, generated_seed, root, kinds, avoid=written_names())
    if generated_only:  # every generated task is a train task: train keeps them all
        if kwargs.get("split") == "train":
            kwargs["split"] = "all"
        return load_harbor(root, name="coding", **kwargs)
    return load_harbor(TASKS, name="coding", train_only=paths, **kwargs)


@cache
def written_names() -> frozenset[str]:
    """Every path and function that a written task's instruction names, train or test:
    read once a process, however many environments it loads."""
    return frozenset().union(*(named(t.read_text()) for t in TASKS.glob("*/instruction.md")))
