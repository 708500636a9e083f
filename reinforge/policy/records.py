"""Checks that a trajectory's token record is exact: what training relies on.

Two properties, for any chat template that does not rewrite history:
- decoding `token_ids` reproduces the conversation as the template renders it;
- each assistant message corresponds to one masked span, whose tokens decode to exactly
  that message's content (plus the EOS token the policy sampled to end its turn).
"""

from __future__ import annotations

from collections.abc import Sequence

from reinforge.policy.chat import ChatFormat
from reinforge.types import Trajectory


def masked_spans(loss_mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of 1s."""
    spans: list[tuple[int, int]] = []
    start = None
    for index, bit in enumerate([*loss_mask, 0]):
        if bit and start is None:
            start = index
        elif not bit and start is not None:
            spans.append((start, index))
            start = None
    return spans


def token_record_problems(
    trajectory: Trajectory, chat: ChatFormat, tools: Sequence[dict] | None = None
) -> list[str]:
    """What is wrong with the trajectory's token record; empty when it is exact."""
    ids, mask = trajectory.token_ids, trajectory.loss_mask
    problems: list[str] = []
    if len(ids) != len(mask):
        return [f"{len(ids)} tokens but {len(mask)} mask entries"]
    if sum(mask) != len(trajectory.logprobs):
        problems.append(f"{sum(mask)} sampled tokens but {len(trajectory.logprobs)} log-probs")
    tokenizer = chat.tokenizer
    decoded = tokenizer.decode(ids)
    rendered = chat.render_text(trajectory.messages, tools)
    if not rendered.startswith(decoded):
        at = next((i for i, (a, b) in enumerate(zip(decoded, rendered, strict=False)) if a != b), 0)
        problems.append(
            f"decoded tokens differ from the rendered conversation at char {at}: "
            f"{decoded[at : at + 40]!r} vs {rendered[at : at + 40]!r}"
        )
    assistant = [m for m in trajectory.messages if m.get("role") == "assistant"]
    spans = masked_spans(mask)
    if len(spans) != len(assistant):
        problems.append(f"{len(spans)} sampled spans but {len(assistant)} assistant messages")
    for number, ((start, end), message) in enumerate(zip(spans, assistant, strict=False)):
        sampled = ids[start:end]
        if sampled and sampled[-1] == tokenizer.eos_token_id:
            sampled = sampled[:-1]
        if tokenizer.decode(sampled) != (message.get("content") or ""):
            problems.append(f"assistant turn {number}: sampled tokens do not decode to its text")
    return problems
