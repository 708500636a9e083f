"""Generated training tasks: the easy tier's kinds of file work (edit a setting, append,
delete or create lines, copy, move, rename, make a folder) and of one-line Python fixes (a
wrong operator, a typo in a message, a print that should be a return, a body to write),
drawn from a seed.

A small model given one reference transcript per written task memorises those
transcripts; given hundreds of variants of the same kinds (other files, keys, values and
wordings) it has to learn the operation. The generated tasks are Harbor task directories
like the written ones (a Dockerfile of COPY lines, hidden tests, `solution/solve.sh`), so
they are graded, audited and replayed by the oracle the same way; they only ever join a
train split, so the held-out tasks stay the written ones.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from reinforge.envs.builtin.coding.generated import files, functions
from reinforge.envs.builtin.coding.generated.task_dir import Spec, write_task

KINDS: dict[str, Callable[[random.Random], Spec]] = {
    kind.__name__.replace("_", "-"): kind
    for kind in (
        *(files.edit, files.delete, files.append, files.create),
        *(files.copy, files.make_dir, files.move, files.rename),
        *(functions.fix_operator, functions.fix_typo),
        *(functions.return_not_print, functions.implement, functions.implement_described),
    )
}
DRAWN = tuple(kind for kind in KINDS if kind != "implement-described")
"""The kinds drawn where none are named. `implement-described` is drawn only when named:
it changes what the agentic job trains on, and docs/coding-job.md's figures are of these."""


NAMED = re.compile(r"`(/[^`\s]+)`|`([A-Za-z_]\w*)\(")
"""What an instruction names: an absolute path, or a function called, in backticks."""


def named(instruction: str) -> set[str]:
    return {path or function for path, function in NAMED.findall(instruction)}


def generate(
    n: int,
    seed: int,
    root: Path,
    kinds: Sequence[str] = DRAWN,
    avoid: frozenset[str] = frozenset(),
) -> list[Path]:
    """`n` task directories under `root`, the `kinds` taken in turn, drawn from `seed`.

    A draw whose instruction names a path or function in `avoid` (those the written tasks
    name) is drawn again: a generated task is another task of the same kind, never a
    written one with other values, so a held-out task is never trained on in disguise."""
    rng = random.Random(seed)
    paths = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        spec = KINDS[kind](rng)
        while named(spec.instruction) & avoid:
            spec = KINDS[kind](rng)
        path = root / f"generated-{kind}-{i:04d}"
        write_task(spec, path)
        paths.append(path)
    return paths
