"""A transformers engine for CPU that batches concurrent requests continuously.

One background thread owns the model. Each iteration it admits waiting requests (one
batched prefill, merged into the running batch's KV cache with left padding), decodes one
token for every running row, and drops rows that finished, so a short completion never
waits for a long one and the batch never decodes padding rows.

Weights change between two decode steps (`weight_update`, `update_weights`), never during
one. An update bumps the policy version, drops the prefix cache and has the rows still
generating recompute their KV cache under the new weights before their next token, so
every sampled token comes wholly from the policy version it records.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import Cache

from reinforge.policy.config import EngineConfig
from reinforge.policy.kv_cache import cache_keyword, roomy_cache
from reinforge.policy.models import load_model
from reinforge.policy.prefix_cache import PrefixCache, PrefixHit
from reinforge.policy.sampling import RowSampler, SamplingParams, sample

FinishReason = Literal["stop", "length"]


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    """Log-prob of each sampled token under the distribution it was drawn from."""
    policy_versions: list[int]
    finish_reason: FinishReason
    stop_text: str | None = None
    """The stop string that ended generation, if one did."""


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: Future[Completion]
    sampler: RowSampler = field(init=False)
    completion: Completion = field(init=False)

    def __post_init__(self) -> None:
        self.sampler = RowSampler(self.params)
        self.completion = Completion([], [], [], "length")


@dataclass
class EngineStats:
    requests: int = 0
    generated_tokens: int = 0
    prefill_tokens: int = 0
    """Prompt tokens computed; those found in the prefix cache are `cached_tokens`."""
    cached_tokens: int = 0
    decode_steps: int = 0
    busy_s: float = 0.0
    recomputed_tokens: int = 0
    """Tokens of running rows whose states were computed again after a weight update."""
    sync_s: float = 0.0
    """Time spent in weight updates, waiting for the engine's lock included."""


class Engine:
    """Generates token-exact completions; thread-safe, with an asyncio front."""

    _BURST_S = 0.005

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        name: str,
        config: EngineConfig,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.config = config
        self.max_context = int(getattr(model.config, "max_position_embeddings", 2048))
        self.eos_ids = eos_ids_of(model.generation_config, tokenizer)
        self._cache_keyword = cache_keyword(model)  # read once: not per decode step
        self.version = 0
        self.stats = EngineStats()
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._prefixes = PrefixCache(config.prefix_cache_mib << 20)
        # Held during a model step and a weight update; reentrant so that a weight update
        # can happen inside `paused()` on the same thread.
        self._lock = threading.RLock()
        self._stale = False  # running rows hold states of older weights (under the lock)
        self._inbox: queue.Queue[_Request | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="reinforge-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_spec(cls, spec: str, config: EngineConfig) -> Engine:
        model, tokenizer = load_model(spec, config.dtype)
        return cls(model, tokenizer, spec, config)

    # -- public API ---------------------------------------------------------------------

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Future[Completion]:
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        request = _Request(list(prompt_ids), params, Future())
        self._inbox.put(request)
        return request.future

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        return await asyncio.wrap_future(self.submit(prompt_ids, params))

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int | None = None) -> int:
        """Copy new weights in place (cast to the engine's dtype); returns the new version:
        `version` when the trainer names it (a resumed run, or an engine that served another
        run before), else the next one.

        Takes effect between two decode steps: tokens after it carry the new version. An
        empty `state` says the engine's own tensors were changed in place (a sampler that
        shares the trainer's model): only the version and the prefix cache change.
        """
        params = dict(self.model.named_parameters())
        unknown = [name for name in state if name not in params]
        if unknown:
            raise KeyError(f"unknown parameter names: {unknown[:5]}")
        misfits = [name for name, t in state.items() if t.shape != params[name].shape]
        if misfits:  # checked before any copy: a failed update leaves the weights whole
            raise ValueError(f"shapes differ from the model's: {misfits[:5]}")
        with self.weight_update(version) as new_version, torch.no_grad():
            for name, tensor in state.items():
                params[name].copy_(tensor)
        return new_version

    @contextmanager
    def weight_update(self, version: int | None = None) -> Iterator[int]:
        """Change the model's weights in the body, e.g. a shared model's `optimizer.step()`.

        The body runs between two decode steps, so no step sees half-updated weights, and
        the version changes with the weights, not a step before or after. On a normal exit
        the prefix cache is dropped, the version becomes `version` (None: the next one)
        and the running rows recompute their states before their next token. Yields the
        version the new weights will carry. If the body raises, nothing changes but the
        time spent: the caller knows best what state it left the weights in.
        """
        started = time.perf_counter()
        try:
            with self._lock:
                new_version = self.version + 1 if version is None else version
                yield new_version
                self._prefixes.clear()
                self._stale = True
                self.version = new_version
        finally:
            self.stats.sync_s += time.perf_counter() - started

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hold decoding for the body (e.g. a trainer's step on the shared model).

        The version does not change; a `weight_update()` may be entered inside.
        """
        with self._lock:
            yield

    def close(self) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=10)

    # -- the batching loop ----------------------------------------------------------------

    def _loop(self) -> None:
        batch = _Batch()
        waiting: list[_Request] = []
        waited_steps = 0
        while True:
            idle = not (batch.requests or waiting)
            open_ = take_requests(self._inbox, waiting, block=idle)
            # Work that arrives at an idle engine usually comes as a burst (a group of
            # rollouts, n > 1, many clients): gather it for one prefill.
            while open_ and idle and len(waiting) < self.config.max_batch:
                time.sleep(self._BURST_S)
                before = len(waiting)
                open_ = take_requests(self._inbox, waiting, block=False)
                if len(waiting) == before:
                    break
            if not open_:
                batch.fail(RuntimeError("engine closed"))
                fail_requests(waiting, RuntimeError("engine closed"))
                return
            room = self.config.max_batch - len(batch.requests)
            arrivals: list[_Request] = []
            # A prefill has a fixed cost (~a decode step), so newcomers join in groups:
            # at once when the batch is empty or enough are waiting, else after a few steps.
            ready = len(waiting) >= min(self.config.admit_group, room) or not batch.requests
            if waiting and room > 0 and (ready or waited_steps >= self.config.admit_wait_steps):
                arrivals, waiting = waiting[:room], waiting[room:]
                waited_steps = 0
            elif waiting:
                waited_steps += 1
            try:
                started = time.perf_counter()
                with self._lock, torch.inference_mode():
                    if self._stale:
                        self._stale = False
                        self._recompute(batch)
                    if arrivals:
                        self._prefill(batch, arrivals)
                    if batch.requests:
                        self._decode(batch)
                self.stats.busy_s += time.perf_counter() - started
            except Exception as error:  # a failed step fails its requests, not the engine
                batch.fail(error)
                fail_requests(arrivals, error)
                batch = _Batch()

    def _prefill(self, batch: _Batch, arrivals: list[_Request]) -> None:
        """Compute the new prompts in one forward and merge them into the running batch.

        Identical prompts (the k rollouts of one task, or `n` > 1) are computed once.
        Each prompt's longest cached prefix is reused: only the rest is computed, so a
        multi-turn episode pays for its new tokens, not for the conversation again.
        """
        unique: dict[tuple[int, ...], int] = {}
        source = [unique.setdefault(tuple(r.prompt_ids), len(unique)) for r in arrivals]
        prompts = list(unique)
        hits = [self._prefixes.lookup(list(p)) for p in prompts]
        cached = [hit.length if hit else 0 for hit in hits]
        new = [p[c:] for p, c in zip(prompts, cached, strict=True)]
        ids, mask = self._layout(new, cached)  # (U, N), (U, C+N)
        cache = _cache_with_prefixes(hits, max(cached))
        logits = self._forward_new(ids, mask, cache)  # (U, V)
        self.stats.prefill_tokens += sum(len(n) for n in new)
        self.stats.cached_tokens += sum(cached)
        self.stats.requests += len(arrivals)
        rows = torch.tensor(source)  # (A,): each arrival's unique prompt
        if len(prompts) < len(arrivals):
            cache.batch_select_indices(rows)
        batch.merge(arrivals, cache, mask.index_select(0, rows))
        self._accept(batch, logits.index_select(0, rows), len(batch.requests) - len(arrivals))

    def _recompute(self, batch: _Batch) -> None:
        """Replace the running rows' KV cache with one computed under the current weights.

        States from older weights would make the next tokens a mix of two policies while
        they record the new version alone. Each row's fed tokens (its prompt and all
        sampled tokens but the last, which `_decode` feeds next) are computed again in one
        left-padded forward, laid out as a prompt with nothing cached.
        """
        if not batch.requests:
            return
        fed = [[*r.prompt_ids, *r.completion.token_ids[:-1]] for r in batch.requests]
        ids, mask = self._layout(fed, [0] * len(fed))  # (B, L), (B, L)
        cache = roomy_cache()
        self._forward_new(ids, mask, cache)
        batch.cache, batch.mask = cache, mask
        self.stats.recomputed_tokens += sum(len(tokens) for tokens in fed)

    def _layout(self, new: list[list[int]], cached: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of new tokens after cached prefixes of the given lengths, left-padded:
        [pad | cached prefix | pad | new tokens]. Returns the new tokens' ids (R, N) and
        the attention mask over prefix and new columns (R, C+N)."""
        c_width, n_width = max(cached), max(len(tokens) for tokens in new)
        ids = torch.full((len(new), n_width), self._pad_id, dtype=torch.long)  # (R, N)
        mask = torch.zeros((len(new), c_width + n_width), dtype=torch.long)  # (R, C+N)
        for row, (tokens, length) in enumerate(zip(new, cached, strict=True)):
            ids[row, n_width - len(tokens) :] = torch.tensor(tokens)
            mask[row, c_width - length : c_width] = 1
            mask[row, c_width + n_width - len(tokens) :] = 1
        return ids, mask

    def _forward_new(self, ids: torch.Tensor, mask: torch.Tensor, cache: Cache) -> torch.Tensor:
        """Run the new columns of a `_layout` into `cache`; the last column's logits (R, V)."""
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, mask.shape[1] - ids.shape[1] :]
        return self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,  # (R, N)
            **{self._cache_keyword: cache},
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]

    def _decode(self, batch: _Batch) -> None:
        """One token for every running row (those prefilled in this iteration included)."""
        if not batch.requests:
            return
        last = torch.tensor([r.completion.token_ids[-1] for r in batch.requests])  # (B,)
        batch.mask = torch.cat(
            [batch.mask, torch.ones((len(batch.requests), 1), dtype=torch.long)], dim=1
        )  # (B, L+1)
        positions = batch.mask.sum(dim=1, keepdim=True) - 1  # (B, 1)
        logits = self.model(
            input_ids=last.unsqueeze(1),
            attention_mask=batch.mask,
            position_ids=positions,
            **{self._cache_keyword: batch.cache},
            use_cache=True,
        ).logits[:, -1]  # (B, V)
        self.stats.decode_steps += 1
        self._accept(batch, logits, first_new_row=0)

    def _accept(self, batch: _Batch, logits: torch.Tensor, first_new_row: int) -> None:
        """Sample for the rows from `first_new_row` on (one logits row each), record the
        tokens and retire the rows that finished."""
        rows = batch.requests[first_new_row:]
        tokens, logprobs = sample(logits, [r.sampler for r in rows])
        finished: list[int] = []
        for offset, (request, token, logprob) in enumerate(
            zip(rows, tokens.tolist(), logprobs.tolist(), strict=True)
        ):
            completion = request.completion
            completion.token_ids.append(token)
            completion.logprobs.append(logprob)
            completion.policy_versions.append(self.version)
            self.stats.generated_tokens += 1
            if self._finished(request, token):
                finished.append(first_new_row + offset)
        for row in finished:
            request = batch.requests[row]
            self._keep_prefix(batch, row)
            request.future.set_result(request.completion)
        batch.retire(finished)

    def _keep_prefix(self, batch: _Batch, row: int) -> None:
        """Cache a finished row's states: its prompt and all sampled tokens but the last,
        which was never fed back."""
        request = batch.requests[row]
        assert batch.cache is not None
        columns = batch.mask[row].nonzero().squeeze(1)  # (L,)
        tokens = (*request.prompt_ids, *request.completion.token_ids[:-1])
        if len(columns) != len(tokens):  # cannot happen unless the bookkeeping is broken
            raise RuntimeError(f"row holds {len(columns)} states for {len(tokens)} tokens")
        keys = [layer.keys[row].index_select(1, columns) for layer in batch.cache.layers]
        values = [layer.values[row].index_select(1, columns) for layer in batch.cache.layers]
        self._prefixes.store(tokens, keys, values)

    def _finished(self, request: _Request, token: int) -> bool:
        completion = request.completion
        if token in self.eos_ids:
            completion.finish_reason = "stop"
            return True
        if request.params.stop:
            text = self.tokenizer.decode(completion.token_ids[-32:])
            for stop in request.params.stop:
                if stop in text:
                    completion.finish_reason, completion.stop_text = "stop", stop
                    return True
        total = len(request.prompt_ids) + len(completion.token_ids)
        if len(completion.token_ids) >= request.params.max_tokens or total >= self.max_context:
            completion.finish_reason = "length"
            return True
        return False


class _Batch:
    """The running rows: their requests, a shared left-padded KV cache and its mask."""

    def __init__(self) -> None:
        self.requests: list[_Request] = []
        self.cache: Cache | None = None
        self.mask = torch.zeros((0, 0), dtype=torch.long)  # (B, L)

    def merge(self, arrivals: list[_Request], cache: Cache, mask: torch.Tensor) -> None:
        if self.cache is None or not self.requests:
            self.requests, self.cache, self.mask = list(arrivals), cache, mask
            return
        width = max(self.mask.shape[1], mask.shape[1])
        for old, new in zip(self.cache.layers, cache.layers, strict=True):
            old.keys = torch.cat([_left_pad(old.keys, width), _left_pad(new.keys, width)])
            old.values = torch.cat([_left_pad(old.values, width), _left_pad(new.values, width)])
        self.mask = torch.cat([_left_pad_mask(self.mask, width), _left_pad_mask(mask, width)])
        self.requests.extend(arrivals)

    def retire(self, rows: list[int]) -> None:
        if not rows:
            return
        gone = set(rows)
        keep = [i for i in range(len(self.requests)) if i not in gone]
        self.requests = [self.requests[i] for i in keep]
        if not keep:
            self.cache, self.mask = None, torch.zeros((0, 0), dtype=torch.long)
            return
        index = torch.tensor(keep)
        # Columns that are padding in every remaining row are dead weight: cut them.
        mask = self.mask.index_select(0, index)  # (B', L)
        start = int((mask.sum(dim=0) > 0).nonzero()[0])
        self.mask = mask[:, start:]
        assert self.cache is not None
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, start:]
            layer.values = layer.values.index_select(0, index)[:, :, start:]

    def fail(self, error: BaseException) -> None:
        fail_requests(self.requests, error)
        self.requests = []


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


def _cache_with_prefixes(hits: list[PrefixHit | None], width: int) -> Cache:
    """A cache holding each row's cached prefix, right-aligned in `width` columns."""
    cache = roomy_cache()
    found = [hit for hit in hits if hit is not None]
    if not found:
        return cache
    for layer, reference in enumerate(found[0].keys):
        heads, _, dim = reference.shape
        keys = reference.new_zeros((len(hits), heads, width, dim))  # (U, H, C, D)
        values = reference.new_zeros((len(hits), heads, width, dim))
        for row, hit in enumerate(hits):
            if hit is not None:
                keys[row, :, width - hit.length :] = hit.keys[layer]
                values[row, :, width - hit.length :] = hit.values[layer]
        cache.update(keys, values, layer)
    return cache


def _left_pad(states: torch.Tensor, width: int) -> torch.Tensor:
    """(B, H, L, D) -> (B, H, width, D), zeros on the left."""
    missing = width - states.shape[2]
    return torch.nn.functional.pad(states, (0, 0, missing, 0)) if missing else states


def _left_pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - mask.shape[1]
    return torch.nn.functional.pad(mask, (missing, 0)) if missing else mask


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
