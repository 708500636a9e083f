"""Reading answers out of model text: tags, integers, and whether a format was followed.

Tool-call parsing lives with the chat template (`reinforge.policy.chat.parse_tool_calls`),
because the server uses it too; it is re-exported here for environment authors.
"""

from __future__ import annotations

import re

from reinforge.policy.chat import ParsedToolCalls, parse_tool_calls

__all__ = [
    "ParsedToolCalls",
    "extract_tag",
    "follows_think_answer",
    "last_integer",
    "parse_tool_calls",
    "strip_think",
]

# Thousands separators only in groups of three; a decimal part makes it not an integer.
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def extract_tag(text: str, tag: str) -> str | None:
    """The content of the last `<tag>...</tag>` block, stripped; None when absent."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
    return found[-1].strip() if found else None


def strip_think(text: str) -> str:
    """The text with `<think>...</think>` blocks removed."""
    return _THINK.sub("", text).strip()


def last_integer(text: str) -> int | None:
    """The last number written in the text, if it is an integer ("1,234" and "12.0" are)."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    whole, _, fraction = found[-1].replace(",", "").partition(".")
    return int(whole) if fraction.strip("0") == "" else None


def follows_think_answer(text: str) -> bool:
    """Optional `<think>...</think>`, then exactly one `<answer>...</answer>`, nothing else."""
    body = strip_think(text)
    return re.fullmatch(r"<answer>(?:(?!<answer>).)*?</answer>", body, re.DOTALL) is not None
