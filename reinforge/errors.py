"""Errors reported to a user in one line, without a traceback: they asked for something
wrong (exit code 2), too many of their rollouts failed (exit code 3), or they stopped a
run with Ctrl-C (exit code 130)."""

from __future__ import annotations

import inspect
import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

_LIBRARIES = {Path(sysconfig.get_path(name)) for name in ("stdlib", "purelib", "platlib")}


class UsageError(Exception):
    """Bad input from the user: unknown environment, unreachable URL, malformed option."""


class ConfigError(UsageError):
    """A config value was rejected: `key` is its dotted path ("" for a rule between
    sections), `problem` says why."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config {key}: {problem}" if key else f"config: {problem}")
        self.key = key
        self.problem = problem


ERRORS_EXIT = 3
"""Exit code of a command stopped by `TooManyErrors`."""


class TooManyErrors(Exception):
    """More rollouts errored or timed out than a command allows (`eval.max_error_rate`,
    `loop.max_error_rate`): a broken environment or grader must not pass for a weak model
    or a hard task. One line and `ERRORS_EXIT`, after the command has written its record."""


INTERRUPTED_EXIT = 130
"""Exit code of a command stopped by Ctrl-C (128 + SIGINT, as a shell reports it)."""
TERMINATED_EXIT = 143
"""Exit code of a command stopped by SIGTERM (128 + SIGTERM), which it handles as Ctrl-C."""


class Interrupted(Exception):
    """Ctrl-C (or SIGTERM) stopped a run, which has saved what it could: the message says
    what became of the step in flight and which checkpoint the run resumes from, so that a
    user knows what was lost before they resume."""


def first_problem(error: ValidationError) -> tuple[str, str]:
    """The dotted path and the message of a validation error's first problem: one line is
    what a user reads, and the first problem is usually the cause of the rest."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    problem = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
    problem = problem.removeprefix("Value error, ")  # a validator's own sentence
    return where, problem


def raised_at(error: BaseException) -> str:
    """`file:line` of the innermost frame of `error` in the user's code (not the standard
    library or an installed package), where a fix would go; "" when there is none."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}:{error.lineno}"
    return user_line(traceback.extract_tb(error.__traceback__))


def user_line(frames: traceback.StackSummary) -> str:
    """`file:line` of the innermost of `frames` in the user's code (not the standard
    library or an installed package); "" when there is none."""
    for frame in reversed(frames):
        path = Path(frame.filename)
        if frame.filename.startswith("<") or any(path.is_relative_to(lib) for lib in _LIBRARIES):
            continue
        return f"{frame.filename}:{frame.lineno}"
    return ""


def defined_at(fn: Callable[..., object]) -> str:
    """`file:line` where `fn` is defined, for a value it returned: there is no frame to
    point at, and its definition is where a fix would go; "" when it has no Python code."""
    fn = inspect.unwrap(fn)  # past decorators, to the function itself
    code = getattr(fn, "__code__", None) or getattr(type(fn).__call__, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else ""


def describe(error: BaseException) -> str:
    """One line for a user: what was raised, and where."""
    where = raised_at(error)
    text = f"{type(error).__name__}: {error}"
    return f"{text} ({where})" if where else text
