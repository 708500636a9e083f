"""The tail rule of a doom loop, over the tokens one completion sampled: a completion loops
at its end when it ends in at least `MIN_COPIES` back-to-back copies of one unit of at most
`MAX_PERIOD` tokens, the copies covering at least `MIN_SPAN` tokens.

It lives beside the engines because both use it: an engine asked to (`stop_loops`) ends a
sample at the first token that makes its tail loop, with finish reason "loop". The loop
metric and penalty (`reinforge/envs/recipes/loops.py`) apply the same rule, so every sample the
engine stops counts as looping there.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

MIN_COPIES = 4
MIN_SPAN = 32
MAX_PERIOD = 64


def tail_loop(
    sequence: Sequence[Hashable],
    min_copies: int = MIN_COPIES,
    min_span: int = MIN_SPAN,
    max_period: int = MAX_PERIOD,
) -> tuple[int, int] | None:
    """(period, copies) of the shortest unit that repeats at the end of `sequence` often and
    long enough to be a loop; None when none does. Copies count whole units only.

    An engine calls it for every token of a row that asks for loop stops, so the common
    case, no loop, costs one comparison per period."""
    n = len(sequence)
    if n < min_span or not n:
        return None
    last = sequence[-1]
    for period in range(1, min(max_period, n // min_copies) + 1):
        if sequence[n - 1 - period] != last:  # no copy of this period ends here
            continue
        matched = 0  # trailing positions equal to the token one period earlier
        end = n - 1
        while matched + period < n and sequence[end - matched] == sequence[end - matched - period]:
            matched += 1
        copies = (matched + period) // period
        if copies >= min_copies and copies * period >= min_span:
            return period, copies
    return None


def loop_end(token_ids: Sequence[int], checked: int) -> int | None:
    """Where a completion that grew past its first `checked` tokens (whose tails did not
    loop) first loops: the length of its shortest longer prefix whose tail loops, the
    tokens to keep when the sample stops there; None when none does. An engine step may add
    more than one token (vLLM's outputs), and the stop belongs at the first that loops."""
    for end in range(checked + 1, len(token_ids) + 1):
        prefix = token_ids if end == len(token_ids) else token_ids[:end]
        if tail_loop(prefix) is not None:
            return end
    return None
