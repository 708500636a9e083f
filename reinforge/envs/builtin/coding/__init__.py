"""`coding`: small Python tasks in Harbor format, bundled with the package.

Each task directory under `tasks/` has an instruction, a Dockerfile that the local
backend replays (FROM, WORKDIR, COPY), hidden tests run after the agent phase and a
reference solution (`--agent oracle`). The tiers are in each task.toml's
`[metadata] difficulty`. `generated` adds generated easy tasks (`generated/`) to the
train split.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any, Self

from pydantic import Field, field_validator, model_validator

from reinforge.envs.builtin.coding.generated import DRAWN, KINDS, generate, named
from reinforge.envs.environment import Environment
from reinforge.envs.harbor.environment import HarborArgs
from reinforge.envs.harbor.environment import load_environment as load_harbor
from reinforge.types import Section, refuse_moved

TASKS = Path(__file__).parent / "tasks"


class Generated(Section):
    """Generated easy tasks: variants of the easy tier's kinds of work that only ever join
    the train split, so the held-out tasks stay the written ones."""

    tasks: int = Field(ge=1)
    """How many, the `kinds` taken in turn."""
    seed: int = 0
    """Draws them: tasks drawn with a seed that training did not use are unseen tasks of
    the kinds it trained on."""
    kinds: list[str] = Field(default_factory=lambda: list(DRAWN), min_length=1)
    """The kinds to generate (all but `implement-described` by default): to measure a
    policy on one kind, or to train on it. GRPO on the kinds the warm-up fails most forgot
    the others (docs/coding-job.md, "What did not work"), so the agentic job draws them
    all."""
    only: bool = False
    """Leave the written tasks out: with a `seed` training did not use, this measures a
    policy on its training distribution, where the written test split measures how far
    that carries."""

    @field_validator("kinds")
    @classmethod
    def _known(cls, kinds: list[str]) -> list[str]:
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown:
            raise ValueError(f"unknown kinds {unknown}: name one or more of {', '.join(KINDS)}")
        return kinds


class Args(HarborArgs):
    generated: Generated | None = None
    """Generated tasks joining the train split; None: the written tasks only."""

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        """The generated tasks' arguments before they were one section: each old key is one
        line saying where it went."""
        if isinstance(data, dict) and isinstance(data.get("generated"), int):
            raise ValueError("generated = N moved to generated.tasks = N")
        moved = {f"generated_{key}": f"generated.{key}" for key in ("seed", "kinds", "only")}
        return refuse_moved(data, moved)

    @model_validator(mode="after")
    def _generated_tasks_train(self) -> Self:
        if self.generated is not None and self.split == "test":
            raise ValueError(
                "generated tasks only join the train split; the test split is the written tasks"
            )
        return self


def load_environment(args: Args) -> Environment:
    generated = args.generated
    if generated is None:
        return load_harbor(TASKS, args, name="coding")
    root = Path(tempfile.mkdtemp(prefix="reinforge-coding-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    avoid = written_names()
    paths = generate(generated.tasks, generated.seed, root, generated.kinds, avoid=avoid)
    if generated.only:  # every generated task is a train task: keep them all
        return load_harbor(root, args.model_copy(update={"split": "all"}), name="coding")
    return load_harbor(TASKS, args, name="coding", train_only=paths)


@cache
def written_names() -> frozenset[str]:
    """Every path and function that a written task's instruction names, train or test:
    read once a process, however many environments it loads."""
    return frozenset().union(*(named(t.read_text()) for t in TASKS.glob("*/instruction.md")))
