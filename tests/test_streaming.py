"""Streams that are live: the real HTTP server, on each engine, sends a choice's text while
the engine is still sampling it, and the pieces join to the response of the same seed;
and the rules by which a piece of text waits until it cannot change."""

from __future__ import annotations

import threading
from typing import Any

import openai
import pytest

from reinforge.policy.engine_thread import Completion, Sampled, TokenListener
from reinforge.policy.models import load_tokenizer
from reinforge.policy.sampling import SamplingParams
from reinforge.policy.streaming import LiveText

from .conftest import EngineUnderTest, http_server

USER = {"role": "user", "content": "What is 2 + 2?"}


class Held:
    """A real engine whose decode loop stops inside each request, once the request's
    tokens make some whole text, until `released` is set. While it is stopped the request
    cannot finish, so text a client receives by then was sent while it was being sampled."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.released = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, on_tokens: TokenListener | None = None
    ) -> Completion:
        text_ids: list[int] = []

        def hold(sampled: Sampled) -> None:  # on the engine's thread
            if on_tokens is not None:
                on_tokens(sampled)
            text_ids.extend(t for t in sampled.token_ids if t not in self.engine.eos_ids)
            text = self.engine.tokenizer.decode(text_ids)
            if text and not text.endswith("\ufffd") and not self.released.wait(timeout=60):
                self.released.set()  # no chunk reached the test: let it fail, not hang

        return await self.engine.generate(prompt_ids, params, hold)


def test_a_stream_sends_text_while_the_engine_is_still_sampling(any_engine: EngineUnderTest):
    recording = any_engine.engine  # logs each completion as the engine returns it
    held = Held(recording)
    with http_server(held) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        finished_before = len(recording.log)
        stream = client.chat.completions.create(
            model="tiny-random", messages=[USER], max_tokens=32, temperature=0, stream=True
        )
        chunks = iter(stream)
        try:
            first = next(c for c in chunks if c.choices and c.choices[0].delta.content)
            # The engine is stopped inside the request: it has not returned its completion.
            assert len(recording.log) == finished_before
            assert first.choices[0].finish_reason is None
        finally:
            held.released.set()
        rest = list(chunks)
    final = rest[-1].choices[0]
    assert final.finish_reason is not None and len(recording.log) == finished_before + 1
    assert final.model_extra["token_ids"] == recording.log[-1][1].token_ids


def test_a_stream_joins_to_the_response_of_the_same_seed(any_engine: EngineUnderTest):
    request: dict[str, Any] = {
        "model": "tiny-random",
        "messages": [USER],
        "n": 2,
        "max_tokens": 24,
        "seed": 11,
        "logprobs": True,
        "top_logprobs": 2,
    }
    with http_server(any_engine.engine) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        whole = client.chat.completions.create(**request)
        stream = client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
    for choice in whole.choices:
        deltas = [c for chunk in chunks for c in chunk.choices if c.index == choice.index]
        assert "".join(d.delta.content or "" for d in deltas) == choice.message.content
        streamed = [e for d in deltas if d.logprobs for e in d.logprobs.content]
        expected = choice.logprobs.content
        assert [e.token for e in streamed] == [e.token for e in expected]
        assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in expected])
        assert [len(e.top_logprobs) for e in streamed] == [2] * len(expected)
        last = deltas[-1]
        assert last.finish_reason == choice.finish_reason
        for key in ("token_ids", "policy_versions", "raw_text"):
            assert last.model_extra[key] == choice.model_extra[key]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def fed(live: LiveText, text: str) -> str:
    """Feed the tokens of `text` one at a time; the text given out meanwhile."""
    tokenizer = load_tokenizer("tiny-random")
    pieces = [live.feed([t]) for t in tokenizer.encode(text, add_special_tokens=False)]
    return "".join(piece.text for piece in pieces if piece is not None)


def live_text(stops: tuple[str, ...] = (), tools: bool = False) -> LiveText:
    tokenizer = load_tokenizer("tiny-random")
    return LiveText(tokenizer, {tokenizer.eos_token_id}, stops, tools)


def test_text_that_may_begin_a_stop_string_waits_until_it_cannot():
    live = live_text(stops=("STOP",))
    assert fed(live, "Hello ST") == "Hello "  # "ST" may begin "STOP"
    assert fed(live, "ART now") == "START now"
    assert live.finish("Hello START now").text == ""


def test_with_tools_text_waits_from_where_a_tool_call_may_begin():
    live = live_text(tools=True)
    assert fed(live, "Let me see.\n<") == "Let me see."  # the newline may be stripped
    assert fed(live, "b> is bold ") == "\n<b> is bold"  # not a call after all
    assert fed(live, '<tool_call>\n{"name": "f"}\n</tool_call>') == ""
    # The rest comes at the end, from the content the calls were parsed out of.
    assert live.finish("Let me see.\n<b> is bold").text == ""


def test_with_tools_text_that_begins_with_whitespace_waits_for_the_end():
    live = live_text(tools=True)
    assert fed(live, "\nHello there") == ""
    assert live.finish("\nHello there").text == "\nHello there"
