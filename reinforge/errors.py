"""Errors that mean "the user asked for something wrong", reported without a traceback."""


class UsageError(Exception):
    """Bad input from the user: unknown environment, unreachable URL, malformed option."""
