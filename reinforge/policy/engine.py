"""A transformers engine, on CPU or CUDA, that batches concurrent requests continuously.

One background thread owns the model. Each iteration it admits waiting requests (one
batched prefill, merged into the running batch's KV cache with left padding; `batch.py`
keeps that cache), decodes one token for every running row, and drops rows that finished,
so a short completion never waits for a long one and the batch never decodes padding rows.
A request may name a listener (`on_tokens`) that gets its tokens as they are sampled,
which is how the server streams; both engines call it the same way.

Weights change between two decode steps (`weight_update`, `update_weights`), never during
one. An update bumps the policy version, drops the prefix cache and has the rows still
generating recompute their KV cache under the new weights before their next token, so
every sampled token comes wholly from the policy version it records.

The engine computes on its model's device (`model.device`): its KV cache, prefix cache
and the batch's tensors live there, and each step's tokens and log-probs come back to the
host as Python numbers. Requests join the batch while its KV cache stays within a budget,
and an out-of-memory fails the request that caused it, not the batch (`memory.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import Cache

from reinforge.policy.batch import Batch, cache_with_prefixes, layout
from reinforge.policy.config import EngineConfig
from reinforge.policy.decode import decode_step
from reinforge.policy.engine_thread import (
    EngineThread,
    Request,
    Sampled,
    eos_ids_of,
    fail_requests,
    take_requests,
)
from reinforge.policy.kv_cache import cache_keyword, roomy_cache
from reinforge.policy.memory import (
    KvBudget,
    did_not_fit,
    is_out_of_memory,
    kv_budget,
    kv_token_bytes,
    release_cached,
)
from reinforge.policy.models import load_model
from reinforge.policy.prefix_cache import PrefixCache
from reinforge.policy.repetition import tail_loop
from reinforge.policy.sampling import Draws, RowSampler, sample
from reinforge.policy.scoring import PromptLogprobs, forward_logprobs


@dataclass
class _Request(Request):
    sampler: RowSampler = field(init=False)

    def __post_init__(self) -> None:
        self.sampler = RowSampler(self.params)


class Engine(EngineThread):
    """Generates token-exact completions; thread-safe, with an asyncio front."""

    _BURST_S = 0.005
    request_type = _Request

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        name: str,
        config: EngineConfig,
        kv_budget_bytes: int | None = None,
    ) -> None:
        """`kv_budget_bytes` bounds the running batch's KV cache; None: the config's
        `kv_memory_fraction` of the memory free on the model's device now."""
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.config = config
        self.device = model.device
        self.max_context = int(getattr(model.config, "max_position_embeddings", 2048))
        self.eos_ids = eos_ids_of(model.generation_config, tokenizer)
        self._cache_keyword = cache_keyword(model)  # read once: not per decode step
        self._decode_step = decode_step(model)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._prefixes = PrefixCache(config.prefix_cache_mib << 20)
        if kv_budget_bytes is None:
            kv_budget_bytes = kv_budget(self.device, config.kv_memory_fraction)
        token_bytes = kv_token_bytes(model.config, model.dtype)
        self.kv_budget = KvBudget(kv_budget_bytes, token_bytes, self.max_context)
        super().__init__()
        self._start("reinforge-engine")

    @classmethod
    def from_spec(cls, spec: str, config: EngineConfig, device: torch.device) -> Engine:
        model, tokenizer = load_model(spec, config.dtype_on(device.type == "cuda"))
        return cls(model.to(device), tokenizer, spec, config)

    def _refusal(self, request: _Request) -> BaseException | None:
        return self.kv_budget.oversized(request)

    # -- public API ---------------------------------------------------------------------

    async def prompt_logprobs(self, token_ids: list[int], top_logprobs: int = 0) -> PromptLogprobs:
        """Each token's log-prob given those before it: one forward over the ids, between
        two decode steps, outside the batch (its prefix cache and padding are for decoding)."""
        return await asyncio.to_thread(self._score, token_ids, top_logprobs)

    def _score(self, token_ids: list[int], top_logprobs: int) -> PromptLogprobs:
        with self._lock, torch.inference_mode():
            scores = forward_logprobs(self.model, token_ids, top_logprobs)
            self.stats.requests += 1
            self.stats.prefill_tokens += len(token_ids)
        return scores

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int | None = None) -> int:
        """Copy new weights in place (to the engine's dtype and device); returns the new version:
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

    # -- the batching loop ----------------------------------------------------------------

    def _loop(self) -> None:
        batch: Batch[_Request] = Batch()
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
                fail_requests([*batch.requests, *waiting], RuntimeError("engine closed"))
                return
            room = self.config.max_batch - len(batch.requests)
            arrivals: list[_Request] = []
            if self.config.admit.admits(len(waiting), room, len(batch.requests), waited_steps):
                taken = self.kv_budget.admissible(batch.requests, waiting[:room])
                arrivals, waiting = waiting[:taken], waiting[taken:]
            if arrivals:
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
                        prefilling = time.perf_counter()
                        self._prefill(batch, arrivals)
                        self.stats.prefill_s += time.perf_counter() - prefilling
                    if batch.requests:
                        decoding = time.perf_counter()
                        self._decode(batch)
                        self.stats.decode_s += time.perf_counter() - decoding
                self.stats.busy_s += time.perf_counter() - started
            except Exception as error:  # fails the step's requests (an out-of-memory, fewer)
                fail_requests([*batch.requests, *arrivals], error)
                batch = Batch()

    def _prefill(self, batch: Batch[_Request], arrivals: list[_Request]) -> None:
        """Compute the new prompts in one forward and merge them into the running batch.

        Identical prompts (the k rollouts of one task, or `n` > 1) are computed once.
        Each prompt's longest cached prefix is reused: only the rest is computed, so a
        multi-turn episode pays for its new tokens, not for the conversation again.

        If memory runs out, the arrivals fail and the running batch is as it was: nothing
        changes it before the merge, which joins every layer or none.
        """
        unique: dict[tuple[int, ...], int] = {}
        source = [unique.setdefault(tuple(r.prompt_ids), len(unique)) for r in arrivals]
        prompts = list(unique)
        hits = [self._prefixes.lookup(list(p)) for p in prompts]
        cached = [hit.length if hit else 0 for hit in hits]
        new = [p[c:] for p, c in zip(prompts, cached, strict=True)]
        try:
            ids, mask = layout(new, cached, self._pad_id, self.device)  # (U, N), (U, C+N)
            cache = cache_with_prefixes(hits, max(cached))
            logits = self._forward_new(ids, mask, cache)  # (U, V)
            rows = torch.tensor(source, device=self.device)  # (A,): each arrival's prompt
            draws = sample(logits.index_select(0, rows), [r.sampler for r in arrivals])
            if len(prompts) < len(arrivals):
                cache.batch_select_indices(rows)
            batch.merge(arrivals, cache, mask.index_select(0, rows))
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            release_cached(self.device)
            longest = max(len(r.prompt_ids) for r in arrivals)
            what = f"prefilling {len(arrivals)} new request(s) of up to {longest} tokens"
            fail_requests(arrivals, did_not_fit(f"{what} ran out; the running ones go on", error))
            return
        self.stats.prefill_tokens += sum(len(n) for n in new)
        self.stats.cached_tokens += sum(cached)
        self.stats.requests += len(arrivals)
        self._accept(batch, draws, len(batch.requests) - len(arrivals))

    def _recompute(self, batch: Batch[_Request]) -> None:
        """Replace the running rows' KV cache with one computed under the current weights.

        States from older weights would make the next tokens a mix of two policies while
        they record the new version alone. Each row's fed tokens (its prompt and all
        sampled tokens but the last, which `_decode` feeds next) are computed again in one
        left-padded forward, laid out as a prompt with nothing cached.
        """
        if not batch.requests:
            return
        fed = [[*r.prompt_ids, *r.completion.token_ids[:-1]] for r in batch.requests]
        ids, mask = layout(fed, [0] * len(fed), self._pad_id, self.device)  # (B, L), (B, L)
        cache = roomy_cache()
        self._forward_new(ids, mask, cache)
        batch.cache, batch.mask = cache, mask
        self.stats.recomputed_tokens += sum(len(tokens) for tokens in fed)

    def _forward_new(self, ids: torch.Tensor, mask: torch.Tensor, cache: Cache) -> torch.Tensor:
        """Run the new columns of a `layout` into `cache`; the last column's logits (R, V)."""
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, mask.shape[1] - ids.shape[1] :]
        return self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,  # (R, N)
            **{self._cache_keyword: cache},
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]

    def _decode(self, batch: Batch[_Request]) -> None:
        """One token for every running row (those prefilled in this iteration included).

        If memory runs out, the row admitted last fails and leaves the batch: rows join at
        the bottom, so it is the newcomer whose admission tipped the batch over. The step
        then runs again for the others, on the cache as it was before the failed step.
        """
        while batch.requests:
            width = batch.mask.shape[1]
            try:
                last = [r.completion.token_ids[-1] for r in batch.requests]
                new_column = torch.ones((len(last), 1), dtype=torch.long, device=self.device)
                mask = torch.cat([batch.mask, new_column], dim=1)  # (B, L+1)
                positions = mask.sum(dim=1, keepdim=True) - 1  # (B, 1)
                ids = torch.tensor(last, device=self.device)  # (B,)
                assert batch.cache is not None
                logits = self._decode_step(ids, mask, positions, batch.cache)  # (B, V)
                draws = sample(logits, [r.sampler for r in batch.requests])
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                batch.cut(width)
                release_cached(self.device)
                newest = batch.requests[-1]
                batch.retire([len(batch.requests) - 1])  # the last row leaves: views, no copy
                what = f"a decode step of {len(batch.requests) + 1} rows ran out"
                fail_requests([newest], did_not_fit(f"{what}; it came last, so it left", error))
                continue
            batch.mask = mask
            self.stats.decode_steps += 1
            self._accept(batch, draws, first_new_row=0)
            return

    def _accept(self, batch: Batch[_Request], draws: Draws, first_new_row: int) -> None:
        """Record the tokens drawn for the rows from `first_new_row` on and retire the rows
        that finished."""
        rows = batch.requests[first_new_row:]
        tokens, logprobs, tops = draws
        finished: list[int] = []
        for offset, (request, token, logprob, top) in enumerate(
            zip(rows, tokens.tolist(), logprobs.tolist(), tops, strict=True)
        ):
            sampled = Sampled([token], [logprob], [] if top is None else [top], [self.version])
            request.completion.extend(sampled, request.on_tokens)
            self.stats.generated_tokens += 1
            if self._finished(request, token):
                finished.append(first_new_row + offset)
        for row in finished:
            request = batch.requests[row]
            self._keep_prefix(batch, row)
            request.future.set_result(request.completion)
        batch.retire(finished)

    def _keep_prefix(self, batch: Batch[_Request], row: int) -> None:
        """Cache a finished row's states: its prompt and all sampled tokens but the last,
        which was never fed back."""
        request = batch.requests[row]
        held, keys, values = batch.row_states(row)
        tokens = (*request.prompt_ids, *request.completion.token_ids[:-1])
        if held != len(tokens):  # cannot happen unless the bookkeeping is broken
            raise RuntimeError(f"row holds {held} states for {len(tokens)} tokens")
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
        if request.params.stop_loops and tail_loop(completion.token_ids) is not None:
            completion.finish_reason = "loop"
            return True
        total = len(request.prompt_ids) + len(completion.token_ids)
        if len(completion.token_ids) >= request.params.max_tokens or total >= self.max_context:
            completion.finish_reason = "length"
            return True
        return False
