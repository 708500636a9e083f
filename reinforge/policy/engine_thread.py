"""What both engines share: the request and completion records, their stats, and the
thread that takes queued requests, with its asyncio front and its lock.

Each engine (`engine.py`, built in; `vllm_engine.py`) runs its own loop on that thread;
the records here are also what the server, its streams and the rollout side read.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from transformers import GenerationConfig, PreTrainedTokenizerBase

from reinforge.policy.sampling import SamplingParams, TopLogprobs

FinishReason = Literal["stop", "length", "loop"]
"""EOS or a stop string; a token limit; a tail that loops, with `stop_loops` set."""


@dataclass(frozen=True)
class Sampled:
    """The tokens one engine step added to one request, as its listener gets them."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[TopLogprobs]
    """One per token when the request asked for alternatives (`top_logprobs`), else []."""
    policy_versions: list[int]


TokenListener = Callable[[Sampled], None]
"""Called on the engine's thread with each step's new tokens of one request, before its
completion resolves. It must return at once and never raise (the decode step of every
running request waits on it): hand the tokens to your own thread, e.g. with
`loop.call_soon_threadsafe`."""


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    """Log-prob of each sampled token under the distribution it was drawn from."""
    policy_versions: list[int]
    finish_reason: FinishReason
    stop_text: str | None = None
    """The stop string that ended generation, if one did."""
    top_logprobs: list[TopLogprobs] = field(default_factory=list)
    """Each token's most likely alternatives under that same distribution, when the
    request asked for them (`SamplingParams.top_logprobs`); else empty."""

    def extend(self, sampled: Sampled, on_tokens: TokenListener | None) -> None:
        """Record a step's tokens and tell the request's listener, if it has one."""
        self.token_ids.extend(sampled.token_ids)
        self.logprobs.extend(sampled.logprobs)
        self.top_logprobs.extend(sampled.top_logprobs)
        self.policy_versions.extend(sampled.policy_versions)
        if on_tokens is not None and sampled.token_ids:
            on_tokens(sampled)


@dataclass
class Request:
    """A request as either engine's thread takes it from the inbox."""

    prompt_ids: list[int]
    params: SamplingParams
    future: Future[Completion]
    on_tokens: TokenListener | None = None
    completion: Completion = field(default_factory=lambda: Completion([], [], [], "length"))


@dataclass
class EngineStats:
    requests: int = 0
    generated_tokens: int = 0
    prefill_tokens: int = 0
    """Prompt tokens computed; those found in the prefix cache are `cached_tokens`."""
    cached_tokens: int = 0
    decode_steps: int = 0
    busy_s: float = 0.0
    """Time holding the model for steps; `prefill_s` and `decode_s` (the built-in engine's
    split of it) are parts of it, each with the sampling and bookkeeping of its tokens."""
    prefill_s: float = 0.0
    decode_s: float = 0.0
    recomputed_tokens: int = 0
    """Tokens of running rows whose states were computed again after a weight update."""
    sync_s: float = 0.0
    """Time spent in weight updates, waiting for the engine's lock included."""


class EngineThread:
    """What both engines share: requests queue for one background thread that owns the
    model (`_loop`), an asyncio front, and one lock that a model step, a weight update and
    `paused()` each hold, so weights change between two steps, never during one."""

    request_type: type[Request] = Request
    close_timeout_s = 10.0

    def __init__(self) -> None:
        self.version = 0
        self.stats = EngineStats()
        # Reentrant so that a weight update can happen inside `paused()` on one thread.
        self._lock = threading.RLock()
        self._stale = False  # requests in flight hold states of older weights (under the lock)
        self._inbox: queue.Queue[Request | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def _start(self, name: str) -> None:
        """Start the thread, once the subclass has everything its `_loop` reads."""
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        raise NotImplementedError

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        on_tokens: TokenListener | None = None,
    ) -> Future[Completion]:
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        request = self.request_type(list(prompt_ids), params, Future(), on_tokens)
        refused = self._refusal(request)
        if refused is None:
            self._inbox.put(request)
        else:
            request.future.set_exception(refused)
        return request.future

    def _refusal(self, request: Any) -> BaseException | None:
        """Why `request` could never be answered, known before it queues (it then fails at
        once, never reaching the engine's loop); None for most."""
        return None

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        on_tokens: TokenListener | None = None,
    ) -> Completion:
        return await asyncio.wrap_future(self.submit(prompt_ids, params, on_tokens))

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hold decoding for the body (e.g. a trainer's step on the shared model).

        The version does not change; a weight update may happen inside.
        """
        with self._lock:
            yield

    def close(self) -> None:
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout=self.close_timeout_s)


class _Queued(Protocol):
    future: Future[Completion]


def take_requests(inbox: queue.Queue[Any], into: list[Any], block: bool) -> bool:
    """Move an engine's queued requests (`None` closes it) to `into`, leaving out those
    cancelled while queued; False once the engine is closed."""
    try:
        item: _Queued | None = inbox.get(block=block)
        while True:
            if item is None:
                return False
            if item.future.set_running_or_notify_cancel():
                into.append(item)
            item = inbox.get_nowait()
    except queue.Empty:
        return True


def fail_requests(requests: Sequence[_Queued], error: BaseException) -> None:
    """Fail the requests not answered yet (either engine's)."""
    for request in requests:
        if not request.future.done():
            request.future.set_exception(error)


def eos_ids_of(generation: GenerationConfig, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """The tokens that end a completion: the model's generation config's and the
    tokenizer's end of sequence."""
    ids: set[int] = set()
    for source in (generation.eos_token_id, tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return ids
