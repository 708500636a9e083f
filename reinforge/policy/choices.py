"""A completion as OpenAI's JSON: the chat or text choice, the log-probs of its tokens
(with their most likely alternatives when asked), the response around the choices, and
the token-id extensions every choice carries. A stream sends the same objects in pieces.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Literal

from transformers import PreTrainedTokenizerBase

from reinforge.policy.chat import parse_tool_calls
from reinforge.policy.engine_thread import Completion
from reinforge.policy.requests import ChatRequest, CompletionRequest
from reinforge.policy.sampling import TopLogprobs
from reinforge.policy.scoring import PromptLogprobs

Json = dict[str, Any]  # a JSON object, as the OpenAI schema shapes it

LOGPROB_FLOOR = -9999.0
"""What a log-prob of -inf (a token outside the top-p nucleus) is written as: JSON has no
infinity, and vLLM's OpenAI server writes the same."""


@dataclass(frozen=True)
class Prompt:
    """A request's prompt as its choices echo or score it."""

    token_ids: list[int]
    scores: PromptLogprobs | None = None
    """Its log-probs, when the request asks for them (`prompt_logprobs`, or `echo` with
    `logprobs`), with as many alternatives as it asks for in either."""


class ChoiceWriter:
    """Writes one engine's completions: its tokenizer names the tokens and its end of
    sequence is left out of the text."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_ids: set[int]) -> None:
        self.tokenizer, self.eos_ids = tokenizer, eos_ids

    def text(self, completion: Completion) -> str:
        """The completion's text: final EOS left out, cut before a stop string."""
        ids = completion.token_ids
        if completion.finish_reason == "stop" and ids and ids[-1] in self.eos_ids:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids)
        if completion.stop_text is not None:
            text = text[: text.find(completion.stop_text)]
        return text

    def chat_choice(self, index: int, completion: Completion, request: ChatRequest) -> Json:
        text = self.text(completion)
        message: Json = {"role": "assistant", "content": text}
        finish: str = completion.finish_reason
        if request.offers_tools:
            parsed = parse_tool_calls(text)
            if parsed.tool_calls:
                message = {
                    "role": "assistant",
                    "content": parsed.content or None,
                    "tool_calls": parsed.tool_calls,
                }
                finish = "tool_calls" if finish == "stop" else finish
        every = range(len(completion.token_ids))
        logprobs = {"content": self.chat_logprobs(completion, every)} if request.logprobs else None
        return {
            "index": index,
            "message": message,
            "finish_reason": finish,
            "logprobs": logprobs,
            **extensions(completion, text),
        }

    def text_choice(
        self, index: int, completion: Completion, request: CompletionRequest, prompt: Prompt
    ) -> Json:
        """With `echo`, the prompt's text before the completion's, and its log-probs before
        the completion's (`max_tokens: 0`: the prompt alone, nothing sampled)."""
        text = self.text(completion)
        every = range(len(completion.token_ids))
        logprobs = self.text_logprobs(completion, every, request)
        choice = {
            "index": index,
            "text": text,
            "finish_reason": completion.finish_reason,
            "logprobs": logprobs,
            **extensions(completion, text),
        }
        if request.echo:
            choice["text"] = self.tokenizer.decode(prompt.token_ids) + text
            if logprobs is not None:
                choice["logprobs"] = self._echoed(prompt, request.alternatives, logprobs)
        if request.prompt_logprobs is not None:
            choice["prompt_logprobs"] = self.prompt_logprobs(prompt, request.prompt_logprobs)
        return choice

    def _echoed(self, prompt: Prompt, k: int, sampled: Json) -> Json:
        """The prompt's log-probs before the `sampled` tokens' ones, as OpenAI's completions
        API writes an echo: the first prompt token's None (nothing predicts it), then log
        p(token | tokens before it). With k > 0 each position's `top_logprobs` maps the k
        most likely tokens and its own to their log-probs. `text_offset` sums the token
        texts' lengths, as vLLM does."""
        scores = prompt.scores
        assert scores is not None  # every echo with logprobs is scored
        tokens = [self._token(t) for t in prompt.token_ids] + sampled["tokens"]
        top = None
        if k:
            scored = zip(prompt.token_ids[1:], scores.logprobs, scores.top_logprobs, strict=True)
            top = [
                None,
                *(self._top(alternatives[:k], t, lp) for t, lp, alternatives in scored),
                *sampled["top_logprobs"],
            ]
        return {
            "tokens": tokens,
            "token_logprobs": [None, *map(_written, scores.logprobs), *sampled["token_logprobs"]],
            "top_logprobs": top,
            "text_offset": list(accumulate((len(t) for t in tokens[:-1]), initial=0)),
        }

    def prompt_logprobs(self, prompt: Prompt, k: int) -> list[Json | None]:
        """vLLM's `prompt_logprobs`: None for the first token, then one object per token
        from token id to its `logprob`, `rank` and `decoded_token`, holding the prompt's own
        token and the k most likely there (ranks 1 to k)."""
        scores = prompt.scores
        assert scores is not None  # every request with prompt_logprobs is scored
        alternatives = scores.top_logprobs or [[] for _ in scores.logprobs]
        entries: list[Json | None] = [None]
        for token, logprob, rank, top in zip(
            prompt.token_ids[1:], scores.logprobs, scores.ranks, alternatives, strict=True
        ):
            entry = {token: self._ranked(token, logprob, rank)}
            for place, (other, other_logprob) in enumerate(top[:k], start=1):
                entry.setdefault(other, self._ranked(other, other_logprob, place))
            entries.append(entry)
        return entries

    def _ranked(self, token_id: int, logprob: float, rank: int) -> Json:
        return {"logprob": _written(logprob), "rank": rank, "decoded_token": self._token(token_id)}

    def chat_logprobs(self, completion: Completion, tokens: Sequence[int]) -> list[Json]:
        """The chat log-prob entries of the tokens at these positions; `top_logprobs` is
        empty unless the request asked for alternatives."""
        entries = []
        for k in tokens:
            top = completion.top_logprobs[k] if completion.top_logprobs else []
            entry = self._entry(completion.token_ids[k], completion.logprobs[k])
            entries.append({**entry, "top_logprobs": [self._entry(t, lp) for t, lp in top]})
        return entries

    def text_logprobs(
        self, completion: Completion, tokens: Sequence[int], request: CompletionRequest
    ) -> Json | None:
        """The completions API's log-probs of the tokens at these positions (None unless
        `logprobs` was sent). With `logprobs` = k > 0 each position's `top_logprobs` maps
        the k most likely tokens, and the sampled one, to their log-probs, as OpenAI does."""
        if request.logprobs is None:
            return None
        entries = [self._entry(completion.token_ids[k], completion.logprobs[k]) for k in tokens]
        top = None
        if request.alternatives:
            top = [
                self._top(
                    completion.top_logprobs[k], completion.token_ids[k], completion.logprobs[k]
                )
                for k in tokens
            ]
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": top,
            "text_offset": None,
        }

    def _entry(self, token_id: int, logprob: float) -> Json:
        token = self._token(token_id)
        return {"token": token, "logprob": _written(logprob), "bytes": list(token.encode())}

    def _top(self, alternatives: TopLogprobs, token_id: int, logprob: float) -> Json:
        """The completions API's `top_logprobs` at one position: the most likely tokens and
        the position's own (sampled or given), by text."""
        top = {self._token(t): _written(lp) for t, lp in alternatives}
        return {**top, self._token(token_id): _written(logprob)}

    def _token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])


def _written(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


def response(
    kind: Literal["chat.completion", "text_completion"],
    model: str,
    policy_version: int,
    prompt_ids: list[int],
    completions: list[Completion],
    choices: list[Json],
) -> Json:
    generated = sum(len(c.token_ids) for c in completions)
    return {
        **envelope(kind, model),
        "choices": choices,
        "usage": usage(len(prompt_ids), generated),
        "prompt_token_ids": prompt_ids,
        "policy_version": policy_version,
    }


def envelope(kind: str, model: str) -> Json:
    """The fields every response (or every chunk of one stream) starts with."""
    prefix = "chatcmpl" if kind.startswith("chat.") else "cmpl"
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
    }


def extensions(completion: Completion, text: str) -> Json:
    return {
        "token_ids": completion.token_ids,
        "policy_versions": completion.policy_versions,
        "raw_text": text,
    }


def usage(prompt_tokens: int, generated: int) -> Json:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": prompt_tokens + generated,
    }
