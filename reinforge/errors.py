"""Errors that mean "the user asked for something wrong", reported without a traceback."""


class UsageError(Exception):
    """Bad input from the user: unknown environment, unreachable URL, malformed option."""


class ConfigError(UsageError):
    """A config value was rejected: `key` is its dotted path, `problem` says why."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config {key}: {problem}")
        self.key = key
        self.problem = problem
