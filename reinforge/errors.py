"""Errors that mean "the user asked for something wrong", reported without a traceback."""

from __future__ import annotations

from pydantic import ValidationError


class UsageError(Exception):
    """Bad input from the user: unknown environment, unreachable URL, malformed option."""


class ConfigError(UsageError):
    """A config value was rejected: `key` is its dotted path, `problem` says why."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config {key}: {problem}")
        self.key = key
        self.problem = problem


def first_problem(error: ValidationError) -> tuple[str, str]:
    """The dotted path and the message of a validation error's first problem: one line is
    what a user reads, and the first problem is usually the cause of the rest."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    problem = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
    problem = problem.removeprefix("Value error, ")  # a validator's own sentence
    return where, problem
