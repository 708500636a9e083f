"""Server-sent events for the completion routes: each choice's text as it is sampled.

The engine hands a request's tokens to a listener as it samples them (`on_tokens`); the
listener moves them onto the server's event loop, and each choice sends a chunk as soon
as new text is certain to belong to its final content. Text is held back while it may
still change:

- a token that ends inside a multi-byte character (or adds no text) waits for the next;
- text that may be the start of a stop string (the content is cut before one);
- with `tools` offered (chat): everything from a whole `<tool_call>` on, and a tail that may begin
  one; whitespace at the end of the text so far; and the whole text while it begins with
  whitespace. Parsed calls leave the text outside them stripped, so until the choice
  ends, such whitespace may or may not be content.

When the choice finishes, the rest of its content comes in one piece, then its parsed tool
calls whole in one delta, then a last chunk with the finish reason and the token-id
extensions. The pieces join to exactly the non-streamed content as long as the tokenizer
decodes a prefix of the tokens to a prefix of the text (byte-level BPE does); with one
that does not, the stream ends with an error event rather than a wrong text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from fastapi.responses import StreamingResponse
from transformers import PreTrainedTokenizerBase

from reinforge.policy.api_errors import error_body
from reinforge.policy.backends import SamplingEngine
from reinforge.policy.choices import ChoiceWriter, Json, Prompt, envelope, usage
from reinforge.policy.engine_thread import Completion, Sampled, TokenListener
from reinforge.policy.requests import ChatRequest, CompletionRequest
from reinforge.policy.sampling import SamplingParams

log = logging.getLogger(__name__)

_TOOL_CALL = "<tool_call>"


def stream(
    engine: SamplingEngine,
    writer: ChoiceWriter,
    request: ChatRequest | CompletionRequest,
    prompt_ids: list[int],
    params: list[SamplingParams],
) -> StreamingResponse:
    """Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`. A client
    that goes away stops the stream, not the sampling already under way."""
    chat = isinstance(request, ChatRequest)
    head = envelope("chat.completion.chunk" if chat else "text_completion", engine.name)

    def chunk(choice: Json) -> str:
        body = {**head, "choices": [choice]}
        if request.include_usage:
            body["usage"] = None
        if choice["finish_reason"] is not None:
            body.update(prompt_token_ids=prompt_ids, policy_version=engine.version)
        return _sse(body)

    async def events() -> AsyncIterator[str]:
        prompt = Prompt(prompt_ids)
        choices = [_ChoiceStream(i, request, writer, prompt) for i in range(len(params))]
        generated = 0
        try:
            for choice in choices:
                for delta in choice.opening():
                    yield chunk(delta)
            async with contextlib.aclosing(_as_sampled(engine, prompt_ids, params)) as updates:
                async for index, update in updates:
                    if isinstance(update, Completion):
                        generated += len(update.token_ids)
                        deltas = choices[index].finish(update)
                    else:
                        deltas = choices[index].feed(update)
                    for delta in deltas:
                        yield chunk(delta)
        except Exception as error:  # headers are sent: the error travels as an event
            log.exception("stream failed")
            yield _sse(error_body(500, f"internal error: {type(error).__name__}: {error}"))
            return
        if request.include_usage:
            yield _sse({**head, "choices": [], "usage": usage(len(prompt_ids), generated)})
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def _as_sampled(
    engine: SamplingEngine, prompt_ids: list[int], params: list[SamplingParams]
) -> AsyncIterator[tuple[int, Sampled | Completion]]:
    """(choice index, new tokens) as the engine samples them, and (choice index,
    completion) once a choice is done, in the order they happened."""
    loop = asyncio.get_running_loop()
    updates: asyncio.Queue[tuple[int, Sampled | Completion | Exception]] = asyncio.Queue()

    def listener(index: int) -> TokenListener:
        def on_tokens(sampled: Sampled) -> None:  # on the engine's thread
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody listens
                loop.call_soon_threadsafe(updates.put_nowait, (index, sampled))

        return on_tokens

    async def run(index: int, choice: SamplingParams) -> None:
        try:
            completion = await engine.generate(prompt_ids, choice, listener(index))
        except Exception as error:
            updates.put_nowait((index, error))
        else:
            # The listener's last call was queued on the loop before the completion's
            # future resolved, so the completion arrives after all of its tokens.
            updates.put_nowait((index, completion))

    tasks = [asyncio.ensure_future(run(index, choice)) for index, choice in enumerate(params)]
    try:
        unfinished = len(tasks)
        while unfinished:
            index, update = await updates.get()
            if isinstance(update, Exception):
                raise update
            unfinished -= isinstance(update, Completion)
            yield index, update
    finally:  # the client went away, or a choice failed
        for task in tasks:
            task.cancel()


@dataclass(frozen=True)
class Piece:
    """A stretch of a choice's text and the positions of the tokens sent with it."""

    text: str
    tokens: list[int]


class LiveText:
    """One choice's text as its tokens arrive, in pieces that are final when given out."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        eos_ids: set[int],
        stops: Sequence[str],
        tools: bool,
    ) -> None:
        self.tokenizer, self.eos_ids, self.tools = tokenizer, eos_ids, tools
        self.markers = (*stops, _TOOL_CALL) if tools else tuple(stops)
        self.ids: list[int] = []
        self.decoded = ""
        """The text of the tokens decoded so far (the newest may still wait)."""
        self.sent = 0
        """How much of `decoded` the pieces given out hold."""
        self.pending: list[int] = []
        """Positions of the tokens not given out with a piece yet."""
        self._context = self._read = 0  # ids[context:read] were decoded: context for the next

    def feed(self, token_ids: list[int]) -> Piece | None:
        """The new text that is certain now, with the tokens since the last piece."""
        for token in token_ids:
            self.pending.append(len(self.ids))
            self.ids.append(token)
            if token not in self.eos_ids:  # EOS ends a completion and is not in its text
                self._decode()
        end = self._certain_end()
        if end <= self.sent:
            return None
        piece = Piece(self.decoded[self.sent : end], self.pending)
        self.sent, self.pending = end, []
        return piece

    def finish(self, content: str) -> Piece:
        """The rest, once the choice is done and `content` is its whole text as the
        non-streamed response holds it."""
        sent = self.decoded[: self.sent]
        if not content.startswith(sent):
            raise RuntimeError(
                f"the streamed text {sent!r} is not the start of the completion's text: "
                "this tokenizer decodes a prefix of the tokens differently from the whole"
            )
        return Piece(content[self.sent :], self.pending)

    def _decode(self) -> None:
        """Add the newest token's text, unless it ends inside a character or adds none.

        Tokens are decoded in a window that starts one decoded step back, as vLLM does: a
        tokenizer may write a token differently at the start of a sequence (a dropped
        leading space), and decoding from the start each time would cost O(n^2)."""
        before = self.tokenizer.decode(self.ids[self._context : self._read])
        after = self.tokenizer.decode(self.ids[self._context :])
        if after.endswith("\ufffd") or len(after) <= len(before):
            return
        self.decoded += after[len(before) :]
        self._context, self._read = self._read, len(self.ids)

    def _certain_end(self) -> int:
        """Where the text that can no longer change ends (see the module's docstring)."""
        text = self.decoded
        if self.tools and text[:1].isspace():
            return 0
        end = len(text)
        for marker in self.markers:
            # No marker starts inside the text sent: its possible start was held back.
            found = text.find(marker, self.sent)
            end = min(end, found if found >= 0 else len(text) - _partial(text, marker))
        if self.tools:
            end = len(text[:end].rstrip())
        return end


def _partial(text: str, marker: str) -> int:
    """The length of the longest end of `text` that `marker` starts with (short of all
    of `marker`)."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


class _ChoiceStream:
    """One choice's chunks, for either route."""

    def __init__(
        self,
        index: int,
        request: ChatRequest | CompletionRequest,
        writer: ChoiceWriter,
        prompt: Prompt,
    ) -> None:
        self.index, self.request, self.writer, self.prompt = index, request, writer, prompt
        tools = isinstance(request, ChatRequest) and request.offers_tools
        self.text = LiveText(writer.tokenizer, writer.eos_ids, request.stop or (), tools)
        self.sampled = Completion([], [], [], "length")
        """The tokens so far, for the log-probs of the pieces sent before the end."""

    def opening(self) -> list[Json]:
        if isinstance(self.request, ChatRequest):
            return [_delta(self.index, {"role": "assistant", "content": ""})]
        return []

    def feed(self, sampled: Sampled) -> list[Json]:
        self.sampled.extend(sampled, None)
        piece = self.text.feed(sampled.token_ids)
        return [] if piece is None else [self._piece(piece, self.sampled)]

    def finish(self, completion: Completion) -> list[Json]:
        """The rest of the text, tool calls, then the last chunk with the extensions."""
        request, index = self.request, self.index
        if isinstance(request, ChatRequest):
            choice = self.writer.chat_choice(index, completion, request)
            message = choice["message"]
            piece = self.text.finish(message["content"] or "")
            has_logprobs = request.logprobs and piece.tokens
            deltas = [self._piece(piece, completion)] if piece.text or has_logprobs else []
            if "tool_calls" in message:
                calls = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
                deltas.append(_delta(index, {"tool_calls": calls}))
            extensions = {k: v for k, v in choice.items() if k not in ("message", "logprobs")}
            return [*deltas, {**_delta(index, {}), **extensions}]
        choice = self.writer.text_choice(index, completion, request, self.prompt)
        piece = self.text.finish(choice["text"])
        has_logprobs = request.logprobs is not None and piece.tokens
        deltas = [self._piece(piece, completion)] if piece.text or has_logprobs else []
        return [*deltas, {**choice, "text": "", "logprobs": None}]

    def _piece(self, piece: Piece, completion: Completion) -> Json:
        request, writer = self.request, self.writer
        if isinstance(request, ChatRequest):
            entries = writer.chat_logprobs(completion, piece.tokens) if request.logprobs else None
            return _delta(self.index, {"content": piece.text}, entries)
        return {
            "index": self.index,
            "text": piece.text,
            "logprobs": writer.text_logprobs(completion, piece.tokens, request),
            "finish_reason": None,
        }


def _delta(index: int, delta: Json, entries: list[Json] | None = None) -> Json:
    return {
        "index": index,
        "delta": delta,
        "logprobs": None if entries is None else {"content": entries},
        "finish_reason": None,
    }


def _sse(data: Json) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
