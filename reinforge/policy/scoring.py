"""Prompt log-probs: how likely a model finds each token of a given sequence.

This is what a teacher gives on-policy distillation (the student's own tokens, scored by
another model) and what the completions API's `echo` with `logprobs` returns. The
log-probs are the raw model's (temperature 1, no nucleus): the distribution a sampler
would start from, not one it was drawn from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from reinforge.policy.sampling import TopLogprobs

_CHUNK = 512
"""Positions whose log-softmax is taken at once, so a long sequence never holds two
copies of its (T, V) logits in float32."""


@dataclass(frozen=True)
class PromptLogprobs:
    """One sequence's scores; the first token has none (nothing predicts it)."""

    logprobs: list[float]
    """log p(token i | tokens before it) for i = 1 .. n-1: n - 1 entries."""
    top_logprobs: list[TopLogprobs]
    """At each of those positions the most likely tokens, when asked for; else []."""
    ranks: list[int]
    """Each of those tokens' rank at its position, 1 for the most likely: how many tokens
    are at least as likely, itself included (as vLLM counts)."""


def forward_logprobs(model: PreTrainedModel, token_ids: list[int], top: int) -> PromptLogprobs:
    """One forward of `model` over `token_ids`, log-softmax in float32. The caller holds
    whatever keeps the weights still (the engine's lock) and no-grad mode."""
    if len(token_ids) < 1:
        raise ValueError("token_ids must not be empty")
    ids = torch.tensor([token_ids], device=model.device)  # (1, n)
    logits = model(input_ids=ids, use_cache=False).logits[0, :-1]  # (n-1, V)
    targets = ids[0, 1:]  # (n-1,)
    logprobs: list[float] = []
    tops: list[TopLogprobs] = []
    ranks: list[int] = []
    for rows, wanted in zip(logits.split(_CHUNK), targets.split(_CHUNK), strict=True):
        logp = torch.log_softmax(rows.float(), dim=-1)  # (c, V)
        own = logp.gather(1, wanted.unsqueeze(1))  # (c, 1)
        logprobs += own.squeeze(1).tolist()
        ranks += (logp >= own).sum(dim=1).tolist()
        if top:
            values, best = torch.topk(logp, top, dim=-1)  # (c, top), descending
            for row_ids, row_values in zip(best.tolist(), values.tolist(), strict=True):
                tops.append(list(zip(row_ids, row_values, strict=True)))
    return PromptLogprobs(logprobs, tops, ranks)
