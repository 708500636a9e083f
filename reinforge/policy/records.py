"""A trajectory's token record (`token_ids`, `loss_mask`) against its messages.

Training reads the tokens; people, other servers and the chat template read the messages.
The two must tell the same conversation, for any chat template that does not rewrite
history:
- decoding `token_ids` reproduces the conversation as the template renders it;
- each assistant message corresponds to one masked span, whose tokens decode to exactly
  that message's content (plus the EOS token the policy sampled to end its turn).

A record that holds only messages (from another OpenAI-compatible server), or another
vocabulary's tokens, gets its token record by rendering the messages one prefix at a time,
so that it comes out as the record a reinforge episode of the same conversation would hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from reinforge.policy.chat import ChatFormat, TemplateError
from reinforge.types import Message, Trajectory, masked_spans

if TYPE_CHECKING:  # as in chat.py: keep transformers out of the environments' import path
    from transformers import PreTrainedTokenizerBase


def sampled_texts(
    ids: list[int], loss_mask: list[int], tokenizer: PreTrainedTokenizerBase
) -> list[str]:
    """The text of each sampled span, less the EOS token that ended its turn."""
    texts: list[str] = []
    for start, end in masked_spans(loss_mask):
        sampled = ids[start:end]
        if sampled[-1] == tokenizer.eos_token_id:
            sampled = sampled[:-1]
        texts.append(tokenizer.decode(sampled))
    return texts


def _assistant_texts(messages: list[Message]) -> list[str]:
    return [m.get("content") or "" for m in messages if m.get("role") == "assistant"]


def is_own_record(trajectory: Trajectory, tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether this tokenizer wrote the token record: each sampled span decodes to its
    assistant message. A record from a server of another model, in another vocabulary,
    does not, and must be rendered from its messages instead."""
    ids = trajectory.token_ids
    if not ids or max(ids) >= len(tokenizer):
        return False
    texts = sampled_texts(ids, trajectory.loss_mask, tokenizer)
    return texts == _assistant_texts(trajectory.messages)


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
    texts = sampled_texts(ids, mask, tokenizer)
    assistant = _assistant_texts(trajectory.messages)
    if len(texts) != len(assistant):
        problems.append(f"{len(texts)} sampled spans but {len(assistant)} assistant messages")
    for number, (text, expected) in enumerate(zip(texts, assistant, strict=False)):
        if text != expected:
            problems.append(f"assistant turn {number}: sampled tokens do not decode to its text")
    return problems


def render_messages(
    messages: list[Message],
    chat: ChatFormat,
    tools: Sequence[dict] | None = None,
    last_turn_ended: bool = True,
) -> tuple[list[int], list[int]]:
    """(token_ids, loss_mask) of a conversation, as a reinforge episode would record it.

    Each assistant turn trains its content and the first token of the template's assistant
    suffix (the end-of-turn token, e.g. `<|im_end|>`); the rest of the suffix and every other
    message is context. The sequence ends at the last assistant turn's end-of-turn token, where
    a recorded episode ends. `last_turn_ended=False` (a truncated episode, which may have been
    cut mid-answer) leaves that last end-of-turn token out.

    `tools` are the tool schemas the policy was offered (`Trajectory.tools`).
    Raises TemplateError when a rendered prefix does not begin the next one.
    """
    tokenizer = chat.tokenizer
    suffix = tokenizer.encode(chat.assistant_suffix, add_special_tokens=False)  # e.g. [eot, \n]
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not turns:
        raise TemplateError("no assistant message to learn from")
    ids: list[int] = []
    mask: list[int] = []
    for turn in turns:
        _extend(ids, mask, chat.prompt_ids(messages[:turn], tools), trained=False)
        closed = chat.render_text(messages[: turn + 1], tools)
        closed_ids = tokenizer.encode(closed, add_special_tokens=False)
        if not suffix or closed_ids[-len(suffix) :] != suffix:
            raise TemplateError(
                f"assistant turn {turns.index(turn)} does not end with the template's "
                f"assistant suffix {chat.assistant_suffix!r}"
            )
        ended = last_turn_ended or turn != turns[-1]
        through = len(closed_ids) - len(suffix) + int(ended)  # content (+ end-of-turn)
        _extend(ids, mask, closed_ids[:through], trained=True)
    return ids, mask


def _extend(ids: list[int], mask: list[int], rendered: list[int], trained: bool) -> None:
    """Append what `rendered` adds after `ids`, which it must begin with."""
    if rendered[: len(ids)] != ids:
        at = next(
            (i for i, (a, b) in enumerate(zip(ids, rendered, strict=False)) if a != b),
            len(rendered),
        )
        raise TemplateError(
            f"rendering one more message changes the tokens before it (at token {at}), so "
            "the conversation has no exact token sequence with this chat template"
        )
    added = rendered[len(ids) :]
    ids.extend(added)
    mask.extend([int(trained)] * len(added))
