"""A generated task as a Harbor task directory: what it holds, and the pieces every
kind's draw is made of."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

WORKDIR = "/app"

TASK_TOML = """schema_version = "1.1"

[metadata]
difficulty = "easy"
category = "{kind}"
tags = ["generated"]

[agent]
timeout_sec = 300.0

[verifier]
timeout_sec = 60.0

[environment]
cpus = 1
memory_mb = 512
storage_mb = 256
"""

TEST_SH = """#!/bin/bash
# Hidden tests, copied in after the agent phase.
if python3 -I /tests/test_task.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""

TEST_PY = """import os
import unittest

FILES = {files!r}
ABSENT = {absent!r}
EMPTY_DIRS = {empty_dirs!r}


class Outcome(unittest.TestCase):
    def test_files(self):
        # Compared line by line (trailing spaces and blank lines at the end do not count).
        for path, expected in FILES.items():
            self.assertFalse(os.path.islink(path), path)
            with open(path) as f:
                lines = [line.rstrip() for line in f.read().splitlines()]
            while lines and not lines[-1]:
                lines.pop()
            self.assertEqual(lines, expected, path)

    def test_absent(self):
        for path in ABSENT:
            self.assertFalse(os.path.lexists(path), path)

    def test_empty_dirs(self):
        for path in EMPTY_DIRS:
            self.assertTrue(os.path.isdir(path) and not os.path.islink(path), path)
            self.assertEqual(os.listdir(path), [], path)


if __name__ == "__main__":
    unittest.main()
"""


CALLS_TEST_PY = """

import ast
import unittest

MODULE = {module!r}
CALLS = {calls!r}
EXPECTED = {expected!r}


class Outcome(unittest.TestCase):
    def test_calls(self):
        got = ast.literal_eval(evaluate(MODULE, "[" + ", ".join(CALLS) + "]"))
        self.assertIs(type(got), list)
        self.assertEqual(got, EXPECTED)
        self.assertEqual([type(g) for g in got], [type(e) for e in EXPECTED])


if __name__ == "__main__":
    unittest.main()
"""
"""Follows FUNCTION_CHECK in a function task's test: the calls and what each returns."""

FUNCTION_CHECK = Path(__file__).with_name("function_check.py")


@cache
def function_check() -> str:
    """FUNCTION_CHECK's text, read once for all the function tasks a draw writes."""
    return FUNCTION_CHECK.read_text()


@dataclass
class Spec:
    """One generated task: what the agent is told, what it finds, what must hold after."""

    kind: str
    instruction: str
    files: dict[str, list[str]]
    """The starting files (relative to the workdir), as lines."""
    solution: str
    expected: dict[str, list[str]]
    absent: list[str] = field(default_factory=list)
    empty_dirs: list[str] = field(default_factory=list)
    calls: dict[str, object] = field(default_factory=dict)
    """For a Python task, calls into the agent's module (`module.function(args)`) and the
    value each must return; the files are then not compared."""


def solve_script(*commands: str) -> str:
    return f"#!/bin/bash\nset -e\ncd {WORKDIR}\n" + "\n".join(commands) + "\n"


def workdir_path(name: str) -> str:
    return f"{WORKDIR}/{name}"


def wording(rng: random.Random, wordings: list[str], **fields: str) -> str:
    """One of a kind's wordings, filled in: the model has to learn the operation, not a
    sentence."""
    return rng.choice(wordings).format(**fields)


def write_task(spec: Spec, path: Path) -> None:
    """`spec` as a Harbor task directory at `path`."""
    (path / "environment").mkdir(parents=True)
    (path / "solution").mkdir()
    (path / "tests").mkdir()
    (path / "task.toml").write_text(TASK_TOML.format(kind=spec.kind))
    (path / "instruction.md").write_text(spec.instruction.rstrip() + "\n")
    dockerfile = ["FROM python:3.11-slim", f"WORKDIR {WORKDIR}"]
    for name, lines in spec.files.items():
        (path / "environment" / name).write_text("\n".join(lines) + "\n")
        dockerfile.append(f"COPY {name} {workdir_path(name)}")
    (path / "environment" / "Dockerfile").write_text("\n".join(dockerfile) + "\n")
    (path / "solution" / "solve.sh").write_text(spec.solution)
    (path / "tests" / "test.sh").write_text(TEST_SH)
    if spec.calls:
        module = next(iter(spec.calls)).split(".")[0]
        calls, expected = list(spec.calls), list(spec.calls.values())
        test = function_check() + CALLS_TEST_PY.format(
            module=module, calls=calls, expected=expected
        )
    else:
        files = {workdir_path(name): lines for name, lines in spec.expected.items()}
        test = TEST_PY.format(files=files, absent=spec.absent, empty_dirs=spec.empty_dirs)
    (path / "tests" / "test_task.py").write_text(test)
