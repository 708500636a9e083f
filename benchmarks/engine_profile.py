"""Where a batch-1 decode step of the built-in engine goes, and what would make it faster.

The engine's step (`policy/decode.py`) runs beside transformers' forward, which it
replaced for Llama-shaped models, and beside candidates that exist only here.

1. The machine's memory read bandwidth (a torch sum over a 512 MiB fp32 tensor, best of
   N, at `--threads`) and the batch-1 floor it sets: the model's weights read once per
   token (tied embeddings counted once).
2. One decode step through transformers' forward as `Engine._decode` made it before its
   written-out step (and still makes it for other models): the mask grows by a column,
   positions are its sum, and the model gets input ids, attention mask, position ids and
   the `roomy_cache` of `RoomyLayer`s, under `torch.inference_mode`; logits for one
   token. The prompt is prefilled the way `Engine._forward_new` does it (not timed).
3. A `torch.profiler` profile of that step (CPU, record_shapes): the top ops by self CPU
   time, aten ops per step, and the share of the matmuls; the same summary for the
   engine's step and the hand-written one.
4. Variants, measured in interleaved rounds (the order rotates every round), each fed
   the same tokens (the fp32 forward's greedy choices), so that each step's logits
   compare with the forward's in the same dtype (max abs difference over all steps):
   - `hf`: transformers' forward, as above;
   - `engine`: the engine's step now, `policy.decode.LlamaDecoder` on the model's own
     weights and the same cache;
   - `engine before`, with `--baseline DIR`: the engine's step and KV cache of another
     checkout of reinforge (its `policy/decode.py` and `policy/kv_cache.py`, e.g. a git
     worktree of the commit before a change), loaded beside this one's, so before and
     after run in the same rounds;
   - `engine N rows` (and `engine before N rows`), with `--rows N`: the engine's step on N
     rows at once, as a batch of concurrent requests runs it: row r holds the prompt less
     its first 2 * (r % 8) tokens, left-padded, and every row is fed the same tokens (the
     logits compared are row 0's, the whole prompt's);
   - `hf no_grad`: the same under `torch.no_grad` (prefill included);
   - `hf mask None`: `attention_mask=None`, as a batch without padding allows;
   - `hand`: a hand-written Llama decode step in plain torch over the same weights, with
     q/k/v and gate/up fused into one matmul each (copies of the weights), the residual
     added by the o and down matmuls (`addmm`), rotary from a precomputed table, and
     SDPA of the 3 groups of 3 query heads straight on the cached keys and values (no
     mask, no repeat of the KV heads); its cache is filled from the prefill's;
   - `hand unfused`: the same on the model's own q, k, v, gate and up weights (what an
     engine sharing the trainer's tensors could run without copies);
   - `compiled`: `torch.compile` (mode default, dynamic=False, fullgraph) of the
     hand-written step with fixed shapes: a preallocated cache of prompt + tokens + 1
     columns, the new column written at a position tensor, attention written out and
     masked to the positions so far; `compiled cpp wrapper`: the same with inductor's
     `cpp_wrapper` (the code calling the kernels in C++, not Python). Compile time is
     measured with an empty inductor cache (TORCHINDUCTOR_CACHE_DIR, a fresh directory
     unless `--inductor-cache` names one), then again in a second process that finds
     that cache on disk;
   - `matmuls only`: the step's matmuls alone (fused q/k/v, o, gate/up, down for 30
     layers, then the vocabulary projection) on fixed inputs: what an eager step that
     cut everything else would still take.
   - with `--threads` above 1, `hf`, `engine` (and `engine before`), `hand` and `matmuls
     only` again at 1 thread (`... 1 thread`): on a shared machine a parallel region waits
     for its slowest thread.
   Also the engine's sampler (`policy.sampling.sample`, temperature 1, top_p 1) on one
   row of logits, per token.

Steps are timed on the wall clock, or with `--clock cpu` on the thread's CPU time
(`time.thread_time`, for `--threads 1`): other processes on a shared machine stretch the
wall clock of a step far more than its CPU time.

    python benchmarks/engine_profile.py [--prompt 45] [--tokens 48] [--rounds 3] [--json out.json]
        [--baseline ../before] [--clock cpu]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from transformers import PreTrainedModel

from reinforge.policy.batch import layout
from reinforge.policy.decode import llama_decoder
from reinforge.policy.kv_cache import cache_keyword, roomy_cache
from reinforge.policy.models import load_model
from reinforge.policy.sampling import RowSampler, SamplingParams, sample
from reinforge.policy.specs import DEFAULT_MODEL

MATMUL_OPS = {
    "aten::mm", "aten::addmm", "aten::bmm", "aten::_mkldnn_linear", "aten::mkldnn_mm",
    "mkldnn::_linear_pointwise",
}  # fmt: skip
"""Ops whose self time is matrix multiplication (their callers, linear and matmul,
only dispatch)."""
DTYPES = ("float32", "bfloat16")
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = CLOCKS["wall"]
"""What a step is timed with (`--clock`)."""


# -- the engine's calls ----------------------------------------------------------------


@dataclass
class HFState:
    cache: Any
    mask: torch.Tensor  # (1, L)


def hf_prefill(
    model: PreTrainedModel, ids: torch.Tensor, make_cache: Callable[[], Any] = roomy_cache
) -> tuple[HFState, torch.Tensor]:
    """`Engine._forward_new` for one row with nothing cached: the state and logits (1, V)."""
    mask = torch.ones_like(ids)  # (1, P)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # (1, P)
    cache = make_cache()
    logits = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        **{cache_keyword(model): cache},
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]
    return HFState(cache, mask), logits


def hf_step(
    model: PreTrainedModel, state: HFState, token: int, *, with_mask: bool = True
) -> torch.Tensor:
    """`Engine._decode` for one row through transformers' forward: logits (1, V) after
    feeding `token`."""
    last = torch.tensor([token])  # (B,)
    positions = grow(state)
    return model(
        input_ids=last.unsqueeze(1),
        attention_mask=state.mask if with_mask else None,
        position_ids=positions,
        **{cache_keyword(model): state.cache},
        use_cache=True,
    ).logits[:, -1]


def engine_step(decoder: Callable[..., torch.Tensor], state: HFState, token: int) -> torch.Tensor:
    """`Engine._decode` for one row through the engine's written-out step: logits (1, V)."""
    positions = grow(state)
    return decoder(torch.tensor([token]), state.mask, positions, state.cache)


def grow(state: HFState) -> torch.Tensor:
    """The mask grown by the new token's column, as `Engine._decode` grows it; the new
    token's position (1, 1)."""
    state.mask = torch.cat([state.mask, torch.ones((1, 1), dtype=torch.long)], dim=1)
    return state.mask.sum(dim=1, keepdim=True) - 1


# -- a hand-written decode step ----------------------------------------------------------


@dataclass
class Layer:
    norm1: torch.Tensor  # (H,)
    qkv: list[torch.Tensor]  # one (Q+2K, H) fused, or q (Q, H), k (K, H), v (K, H)
    o: torch.Tensor  # (H, Q)
    norm2: torch.Tensor  # (H,)
    gate_up: list[torch.Tensor]  # one (2I, H) fused, or gate (I, H), up (I, H)
    down: torch.Tensor  # (H, I)


class HandLlama:
    """A Llama decode step at batch 1 in plain torch, on the weights of an HF model."""

    def __init__(
        self, model: PreTrainedModel, fused: bool, max_len: int, like: HandLlama | None = None
    ) -> None:
        """`like`: another instance on the same model whose (fused) weights to share."""
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.group = self.heads // self.kv_heads
        self.eps = config.rms_norm_eps
        self.max_len = max_len
        dtype = model.dtype
        self.embed = model.model.embed_tokens.weight  # (V, H)
        self.lm_head = model.lm_head.weight  # (V, H), tied to embed
        self.norm = model.model.norm.weight
        self.layers: list[Layer] = like.layers if like is not None else []
        for block in model.model.layers if like is None else []:
            attn, mlp = block.self_attn, block.mlp
            qkv = [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]
            gate_up = [mlp.gate_proj.weight, mlp.up_proj.weight]
            if fused:
                qkv, gate_up = [torch.cat(qkv).contiguous()], [torch.cat(gate_up).contiguous()]
            self.layers.append(
                Layer(
                    block.input_layernorm.weight,
                    qkv,
                    attn.o_proj.weight,
                    block.post_attention_layernorm.weight,
                    gate_up,
                    mlp.down_proj.weight,
                )
            )
        # Rotary as HF computes it: (position * inv_freq) in fp32, cos/sin cast to dtype.
        inv_freq = model.model.rotary_emb.inv_freq.float()  # (D/2,)
        freqs = torch.arange(max_len, dtype=torch.float32)[:, None] * inv_freq  # (T, D/2)
        table = torch.cat([freqs, freqs], dim=-1)  # (T, D)
        self.cos, self.sin = table.cos().to(dtype), table.sin().to(dtype)
        shape = (1, self.kv_heads, max_len, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype) for _ in self.layers]
        self.values = [torch.zeros(shape, dtype=dtype) for _ in self.layers]
        self.columns = torch.arange(max_len)  # (T,)

    def load(self, cache: Any) -> int:
        """Copy a prefilled HF cache (batch 1) into the buffers; returns its length."""
        length = 0
        for layer, keys, values in zip(cache.layers, self.keys, self.values, strict=True):
            length = layer.keys.shape[2]
            keys.zero_()
            values.zero_()
            keys[:, :, :length] = layer.keys
            values[:, :, :length] = layer.values
        return length

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """HF's LlamaRMSNorm: computed in fp32, cast back before the weight."""
        if x.dtype == torch.float32:  # no casts to dispatch
            return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x32.to(x.dtype)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (N, D) of heads at one position; cos, sin (1, D) or (D,)."""
        half = self.head_dim // 2
        rotated = torch.cat([-x[:, half:], x[:, :half]], dim=-1)
        return x * cos + rotated * sin

    def _project(self, h: torch.Tensor, layer: Layer) -> tuple[torch.Tensor, torch.Tensor]:
        """h (1, H) -> rotated q and k as one (Nq+Nk, D) and v (Nk, D); cos/sin applied later."""
        d = self.head_dim
        if len(layer.qkv) == 1:
            qkv = F.linear(h, layer.qkv[0]).view(-1, d)  # (Nq+2Nk, D)
            return qkv[: self.heads + self.kv_heads], qkv[self.heads + self.kv_heads :]
        q, k, v = (F.linear(h, w).view(-1, d) for w in layer.qkv)
        return torch.cat([q, k]), v

    def _mlp(self, h: torch.Tensor, layer: Layer) -> torch.Tensor:
        if len(layer.gate_up) == 1:
            gate, up = F.linear(h, layer.gate_up[0]).chunk(2, dim=-1)
        else:
            gate, up = (F.linear(h, w) for w in layer.gate_up)
        return F.silu(gate) * up

    def step(self, token: int, position: int) -> torch.Tensor:
        """Eager step: feed `token` at `position`; logits (1, V)."""
        x = self.embed[token].unsqueeze(0)  # (1, H)
        cos, sin = self.cos[position], self.sin[position]  # (D,)
        for layer, keys, values in zip(self.layers, self.keys, self.values, strict=True):
            qk, v = self._project(self._norm(x, layer.norm1), layer)
            qk = self._rope(qk, cos, sin)
            keys.select(2, position).copy_(qk[self.heads :].unsqueeze(0))
            values.select(2, position).copy_(v.unsqueeze(0))
            q = qk[: self.heads].view(1, self.kv_heads, self.group, self.head_dim)
            attended = F.scaled_dot_product_attention(
                q, keys.narrow(2, 0, position + 1), values.narrow(2, 0, position + 1)
            )  # (1, Nk, G, D): query head h = kv head h // G, as HF's repeat_kv has it
            x = torch.addmm(x, attended.reshape(1, -1), layer.o.t())
            x = torch.addmm(x, self._mlp(self._norm(x, layer.norm2), layer), layer.down.t())
        return F.linear(self._norm(x, self.norm), self.lm_head)

    def static_step(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Fixed-shape step for torch.compile: token (1,), position (1,) long; (1, V)."""
        x = F.embedding(token, self.embed)  # (1, H)
        cos, sin = self.cos.index_select(0, position), self.sin.index_select(0, position)
        seen = (self.columns <= position).view(1, 1, 1, -1)  # (1, 1, 1, T)
        for layer, keys, values in zip(self.layers, self.keys, self.values, strict=True):
            qk, v = self._project(self._norm(x, layer.norm1), layer)
            qk = self._rope(qk, cos, sin)
            keys.index_copy_(2, position, qk[self.heads :].view(1, self.kv_heads, 1, -1))
            values.index_copy_(2, position, v.view(1, self.kv_heads, 1, -1))
            q = qk[: self.heads].view(1, self.kv_heads, self.group, self.head_dim)
            # Written out: SDPA with a mask over all T columns ran ~7x slower than
            # unmasked SDPA on the columns so far (CPU flash kernel), and inductor fuses this.
            scores = torch.matmul(q, keys.transpose(2, 3)) * self.head_dim**-0.5  # (1,Nk,G,T)
            scores = scores.masked_fill(~seen, float("-inf"))
            probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            attended = torch.matmul(probs, values)  # (1, Nk, G, D)
            x = torch.addmm(x, attended.reshape(1, -1), layer.o.t())
            x = torch.addmm(x, self._mlp(self._norm(x, layer.norm2), layer), layer.down.t())
        return F.linear(self._norm(x, self.norm), self.lm_head)

    def matmuls(self) -> Callable[[], torch.Tensor]:
        """The step's matmuls alone, on fixed inputs (fused weights expected)."""
        dtype = self.embed.dtype
        hidden = torch.randn(1, self.embed.shape[1]).to(dtype)
        attended = torch.randn(1, self.heads * self.head_dim).to(dtype)
        inner = torch.randn(1, self.layers[0].down.shape[1]).to(dtype)

        def run() -> torch.Tensor:
            for layer in self.layers:
                for weight in layer.qkv:
                    F.linear(hidden, weight)
                torch.addmm(hidden, attended, layer.o.t())
                for weight in layer.gate_up:
                    F.linear(hidden, weight)
                torch.addmm(hidden, inner, layer.down.t())
            return F.linear(hidden, self.lm_head)

        return run


# -- variants ----------------------------------------------------------------------------


@dataclass
class Run:
    """One decode of the fed tokens: each step's seconds and logits."""

    seconds: list[float]
    logits: list[torch.Tensor]


Variant = Callable[[torch.Tensor, list[int]], Run]


def timed(
    mode: Callable[[], AbstractContextManager[Any]],
    start: Callable[[], Any],
    step: Callable[[Any, int, int], torch.Tensor],
) -> Variant:
    """A variant: `start()` (untimed, under `mode`) gives a state; `step(state, token,
    position)` is timed per fed token."""

    def run(ids: torch.Tensor, fed: list[int]) -> Run:
        seconds, logits = [], []
        with mode():
            state = start()
            for offset, token in enumerate(fed):
                started = clock()
                out = step(state, token, ids.shape[1] + offset)
                seconds.append(clock() - started)
                logits.append(out.float().clone())
        return Run(seconds, logits)

    return run


def hf_variant(
    model: PreTrainedModel,
    ids: torch.Tensor,
    mode: Callable[[], AbstractContextManager[Any]],
    with_mask: bool = True,
) -> Variant:
    return timed(
        mode,
        lambda: hf_prefill(model, ids)[0],
        lambda state, token, _: hf_step(model, state, token, with_mask=with_mask),
    )


def engine_variant(
    model: PreTrainedModel, ids: torch.Tensor, baseline: Baseline | None = None
) -> Variant:
    """The engine's step, or with `baseline` that checkout's step on its own cache."""
    decoder, make_cache = engine_parts(model, baseline)
    return timed(
        torch.inference_mode,
        lambda: hf_prefill(model, ids, make_cache)[0],
        lambda state, token, _: engine_step(decoder, state, token),
    )


def rows_variant(
    model: PreTrainedModel, ids: torch.Tensor, rows: int, baseline: Baseline | None = None
) -> Variant:
    """The engine's step (or `baseline`'s) on `rows` rows of a left-padded batch, prefilled
    as `Engine._forward_new` does it; each step's logits are row 0's (1, V)."""
    decoder, make_cache = engine_parts(model, baseline)
    prompts = [ids[0, 2 * (row % 8) :].tolist() for row in range(rows)]

    def start() -> HFState:
        tokens, mask = layout(prompts, [0] * rows, 0, torch.device("cpu"))  # (R, P) each
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = make_cache()
        model(
            input_ids=tokens,
            attention_mask=mask,
            position_ids=positions,
            **{cache_keyword(model): cache},
            use_cache=True,
            logits_to_keep=1,
        )
        return HFState(cache, mask)

    def step(state: HFState, token: int, _: int) -> torch.Tensor:
        state.mask = torch.cat([state.mask, torch.ones((rows, 1), dtype=torch.long)], dim=1)
        positions = state.mask.sum(dim=1, keepdim=True) - 1  # (R, 1)
        return decoder(torch.full((rows,), token), state.mask, positions, state.cache)[:1]

    return timed(torch.inference_mode, start, step)


def engine_parts(
    model: PreTrainedModel, baseline: Baseline | None
) -> tuple[Callable[..., torch.Tensor], Callable[[], Any]]:
    """The engine's decode step and cache maker: this checkout's, or `baseline`'s."""
    if baseline is None:
        decoder, make_cache = llama_decoder(model), roomy_cache
    else:
        decoder, make_cache = baseline.decode.llama_decoder(model), baseline.kv_cache.roomy_cache
    assert decoder is not None, "the default model is a plain Llama"
    return decoder, make_cache


@dataclass
class Baseline:
    """Another checkout's `policy/kv_cache.py` and `policy/decode.py`, loaded as modules of
    their own beside this checkout's (`--baseline`)."""

    kv_cache: ModuleType
    decode: ModuleType

    @classmethod
    def load(cls, root: str) -> Baseline:
        modules = []
        for name in ("kv_cache", "decode"):
            path = Path(root) / "reinforge" / "policy" / f"{name}.py"
            spec = importlib.util.spec_from_file_location(f"baseline_{name}", path)
            if spec is None or spec.loader is None:
                raise SystemExit(f"--baseline: no {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            modules.append(module)
        return cls(*modules)


def hand_variant(model: PreTrainedModel, ids: torch.Tensor, hand: HandLlama) -> Variant:
    def start() -> HandLlama:
        hand.load(hf_prefill(model, ids)[0].cache)
        return hand

    return timed(torch.inference_mode, start, lambda h, token, pos: h.step(token, pos))


def one_thread(variant: Variant) -> Variant:
    """The variant run with 1 torch thread."""

    def run(ids: torch.Tensor, fed: list[int]) -> Run:
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return variant(ids, fed)
        finally:
            torch.set_num_threads(before)

    return run


def compiled_variant(
    model: PreTrainedModel, ids: torch.Tensor, hand: HandLlama, compiled: Callable[..., Any]
) -> Variant:
    def start() -> HandLlama:
        hand.load(hf_prefill(model, ids)[0].cache)
        return hand

    def step(_: HandLlama, token: int, position: int) -> torch.Tensor:
        return compiled(torch.tensor([token]), torch.tensor([position]))

    return timed(torch.inference_mode, start, step)


def matmul_variant(hand: HandLlama) -> Variant:
    run_matmuls = hand.matmuls()

    def run(ids: torch.Tensor, fed: list[int]) -> Run:
        seconds = []
        with torch.inference_mode():
            for _ in fed:
                started = clock()
                run_matmuls()
                seconds.append(clock() - started)
        return Run(seconds, [])

    return run


COMPILE_MODES = {"default": {}, "cpp_wrapper": {"cpp_wrapper": True}}
"""Inductor options of each compiled variant: its defaults, and C++ instead of Python for
the code that calls the kernels."""


def compile_step(hand: HandLlama, mode: str) -> tuple[Callable[..., Any], float]:
    """torch.compile of the static step; the compiled function and the seconds its first
    call took (compiling included)."""
    compiled = torch.compile(
        hand.static_step, dynamic=False, fullgraph=True, options=COMPILE_MODES[mode]
    )
    started = time.perf_counter()
    with torch.inference_mode():
        compiled(torch.tensor([0]), torch.tensor([0]))
    return compiled, time.perf_counter() - started


# -- measurements ------------------------------------------------------------------------


def read_bandwidth(repeats: int = 10) -> float:
    """Bytes per second a torch sum reads from a 512 MiB fp32 tensor, best of `repeats`."""
    tensor = torch.ones(128 << 20)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        tensor.sum()
        best = min(best, time.perf_counter() - started)
    return tensor.numel() * 4 / best


def weight_bytes(model: PreTrainedModel) -> int:
    """Bytes of the parameters, each tensor once (the tied embedding is one)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def profile_steps(step: Callable[[], Any], steps: int, top: int) -> tuple[dict[str, Any], profile]:
    """Profile `steps` calls of `step`: top ops by self CPU time, aten ops per step (all,
    and those called from Python) and the matmuls' share of the ops' self time."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        started = time.perf_counter()
        for _ in range(steps):
            step()
        wall = time.perf_counter() - started
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)  # microseconds
    aten = sum(e.count for e in events if e.key.startswith("aten::"))
    called = sum(
        1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None
    )  # ops called from Python, not from other ops
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS)
    ranked = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {
        "wall_ms_per_step": wall * 1000 / steps,
        "ops_self_ms_per_step": total / 1000 / steps,
        "aten_ops_per_step": aten / steps,
        "ops_called_from_python_per_step": called / steps,
        "matmul_share_of_self_time": matmul / total if total else 0.0,
        "top_ops": [
            {
                "op": e.key,
                "self_ms_per_step": e.self_cpu_time_total / 1000 / steps,
                "share": e.self_cpu_time_total / total,
                "calls_per_step": e.count / steps,
            }
            for e in ranked
        ],
    }, prof


def sampling_ms(vocab: int, repeats: int = 50) -> float:
    """Median ms of the engine's sampler on one row (temperature 1, top_p 1)."""
    rows = [
        RowSampler(
            SamplingParams(max_tokens=1, temperature=1.0, top_p=1.0, stop_loops=False, seed=0)
        )
    ]
    logits = torch.randn(1, vocab)
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            started = time.perf_counter()
            sample(logits, rows)
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def compile_child(dtype: str, mode: str, prompt: int, tokens: int) -> None:
    """In a fresh process: build and compile the static step; print its compile seconds."""
    model, _ = load_model(DEFAULT_MODEL, dtype)
    hand = HandLlama(model, fused=True, max_len=prompt + tokens + 1)
    _, seconds = compile_step(hand, mode)
    print(json.dumps({"compile_s": seconds}))


def warm_compile_s(dtype: str, mode: str, prompt: int, tokens: int, threads: int) -> float | None:
    """Compile seconds in a second process that finds the inductor cache on disk."""
    done = subprocess.run(
        [sys.executable, __file__, "--compile-child", dtype, mode, "--prompt", str(prompt),
         "--tokens", str(tokens), "--threads", str(threads)],
        capture_output=True, text=True, env=os.environ.copy(), check=False,
    )  # fmt: skip
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return float(json.loads(line)["compile_s"])
    print(f"second compile process failed:\n{done.stderr[-2000:]}", file=sys.stderr)
    return None


def compare_before(
    seconds: dict[str, dict[str, list[float]]], logits: dict[str, dict[str, list[torch.Tensor]]]
) -> dict[str, dict[str, Any]]:
    """Each `engine before ...` variant against its `engine ...` one, per dtype: the ratio
    of their medians, each round's ratio (the two ran in the same round) and the largest
    logit difference between them in the last round."""
    compared = {}
    for dtype, per_variant in seconds.items():
        for before_name, before in per_variant.items():
            after_name = before_name.replace("engine before", "engine", 1)
            if not before_name.startswith("engine before") or after_name not in per_variant:
                continue
            after = per_variant[after_name]
            ratios = [a / b for a, b in zip(after, before, strict=True)]
            pairs = zip(logits[dtype][after_name], logits[dtype][before_name], strict=True)
            compared[f"{dtype} {after_name}"] = {
                "ratio_of_medians": statistics.median(after) / statistics.median(before),
                "round_ratios": ratios,
                "median_round_ratio": statistics.median(ratios),
                "max_abs_logit_diff": max(float((a - b).abs().max()) for a, b in pairs),
            }
    return compared


# -- main ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--prompt", type=int, default=45, help="prompt tokens (45: the arithmetic prompts')"
    )
    parser.add_argument("--tokens", type=int, default=48, help="decode steps per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--profile-steps", type=int, default=8)
    parser.add_argument("--top", type=int, default=15, help="ops listed from the profile")
    parser.add_argument(
        "--compile",
        nargs="*",
        default=list(COMPILE_MODES),
        choices=list(COMPILE_MODES),
        help="compiled variants (none: no torch.compile)",
    )
    parser.add_argument("--inductor-cache", help="TORCHINDUCTOR_CACHE_DIR (default: fresh)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument(
        "--baseline", help="another checkout of reinforge: its engine step as `engine before`"
    )
    parser.add_argument(
        "--clock", choices=list(CLOCKS), default="wall", help="cpu: the thread's CPU time"
    )
    parser.add_argument("--rows", type=int, help="also the engine's step on this many rows")
    parser.add_argument("--compile-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    baseline = Baseline.load(args.baseline) if args.baseline else None
    if args.compile_child:
        compile_child(*args.compile_child, args.prompt, args.tokens)
        return
    if args.compile:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = args.inductor_cache or tempfile.mkdtemp(
            prefix="inductor-"
        )

    load_before = os.getloadavg()
    bandwidths = [read_bandwidth()]  # again in every round and at the end; the best counts
    bandwidth = bandwidths[0]
    print(f"threads {args.threads}, load average {load_before[0]:.1f}")
    print(f"memory read bandwidth {bandwidth / 1e9:.1f} GB/s (best of 10, 512 MiB sum)")

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 20000, (1, args.prompt), generator=generator)  # (1, P)
    models = {dtype: load_model(DEFAULT_MODEL, dtype)[0] for dtype in args.dtypes}
    floor_ms = {d: weight_bytes(m) / bandwidth * 1000 for d, m in models.items()}
    for dtype, model in models.items():
        print(f"floor {dtype}: {weight_bytes(model) / 1e6:.0f} MB -> {floor_ms[dtype]:.1f} ms")

    # Fed tokens: the fp32 forward's greedy choices (any dtype's if fp32 is not asked).
    reference_model = models[args.dtypes[0]]
    fed: list[int] = []
    with torch.inference_mode():
        state, logits = hf_prefill(reference_model, ids)
        for _ in range(args.tokens):
            fed.append(int(logits.argmax()))
            logits = hf_step(reference_model, state, fed[-1])

    variants: dict[str, dict[str, Variant]] = {}
    compile_s: dict[str, dict[str, dict[str, float | None]]] = {}
    hands: dict[str, HandLlama] = {}
    for dtype, model in models.items():
        max_len = args.prompt + args.tokens + 1
        hand = HandLlama(model, fused=True, max_len=max_len)
        hands[dtype] = hand
        variants[dtype] = {
            "hf": hf_variant(model, ids, torch.inference_mode),
            "engine": engine_variant(model, ids),
        }
        if baseline is not None:
            variants[dtype]["engine before"] = engine_variant(model, ids, baseline)
        if args.rows:
            variants[dtype][f"engine {args.rows} rows"] = rows_variant(model, ids, args.rows)
            if baseline is not None:
                variants[dtype][f"engine before {args.rows} rows"] = rows_variant(
                    model, ids, args.rows, baseline
                )
        variants[dtype] |= {
            "hf no_grad": hf_variant(model, ids, torch.no_grad),
            "hf mask None": hf_variant(model, ids, torch.inference_mode, with_mask=False),
            "hand": hand_variant(model, ids, hand),
            "hand unfused": hand_variant(model, ids, HandLlama(model, False, max_len)),
            "matmuls only": matmul_variant(hand),
        }
        if args.threads > 1:
            for name in ("hf", "engine", "engine before", "hand", "matmuls only"):
                if name in variants[dtype]:
                    variants[dtype][f"{name} 1 thread"] = one_thread(variants[dtype][name])
        for mode in args.compile:
            static = HandLlama(model, fused=True, max_len=max_len, like=hand)
            compiled, cold = compile_step(static, mode)
            print(f"torch.compile {dtype} {mode}: {cold:.1f} s, first in this process", flush=True)
            warm = warm_compile_s(dtype, mode, args.prompt, args.tokens, args.threads)
            if warm is not None:
                print(f"torch.compile {dtype} {mode}: {warm:.1f} s in a second process", flush=True)
            compile_s.setdefault(dtype, {})[mode] = {"cold_s": cold, "second_process_s": warm}
            name = "compiled" if mode == "default" else f"compiled {mode.replace('_', ' ')}"
            variants[dtype][name] = compiled_variant(model, ids, static, compiled)

    # Profiles: the engine's step, and the hand-written one for comparison.
    profiles: dict[str, Any] = {}
    for dtype, model in models.items():
        with torch.inference_mode():
            state, _ = hf_prefill(model, ids)
            for token in fed[:2]:  # warm-up
                hf_step(model, state, token)
            profiles[f"hf {dtype}"], _ = profile_steps(
                lambda m=model, s=state: hf_step(m, s, fed[0]), args.profile_steps, args.top
            )
            decoder = llama_decoder(model)
            assert decoder is not None
            state, _ = hf_prefill(model, ids)
            profiles[f"engine {dtype}"], prof = profile_steps(
                lambda d=decoder, s=state: engine_step(d, s, fed[0]), args.profile_steps, args.top
            )
            if baseline is not None:
                before = baseline.decode.llama_decoder(model)
                state, _ = hf_prefill(model, ids, baseline.kv_cache.roomy_cache)
                profiles[f"engine before {dtype}"], _ = profile_steps(
                    lambda d=before, s=state: engine_step(d, s, fed[0]),
                    args.profile_steps,
                    args.top,
                )
            hand = hands[dtype]
            position = hand.load(hf_prefill(model, ids)[0].cache)
            profiles[f"hand {dtype}"], _ = profile_steps(
                lambda h=hand, p=position: h.step(fed[0], p), args.profile_steps, args.top
            )
        print(f"\nprofile of the engine's step, {dtype}, {args.profile_steps} steps")
        print(
            prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top),
            end="",
        )
        print(
            prof.key_averages(group_by_input_shape=True).table(
                sort_by="self_cpu_time_total", row_limit=6, max_name_column_width=30
            ),
            end="",
        )
        for name in (f"hf {dtype}", f"engine before {dtype}", f"engine {dtype}", f"hand {dtype}"):
            if name not in profiles:
                continue
            p = profiles[name]
            print(
                f"{name}: {p['ops_called_from_python_per_step']:.0f} ops called per step"
                f" ({p['aten_ops_per_step']:.0f} with the ops they call), ops' self time"
                f" {p['ops_self_ms_per_step']:.1f} ms of {p['wall_ms_per_step']:.1f} ms wall"
                f" (profiled), matmuls {p['matmul_share_of_self_time']:.0%} of self time"
            )

    # Interleaved rounds.
    seconds: dict[str, dict[str, list[float]]] = {d: {n: [] for n in variants[d]} for d in variants}
    diffs: dict[str, dict[str, float]] = {d: {} for d in variants}
    fp32_diffs: dict[str, float] = {}  # bf16 variants against the fp32 forward
    last_logits: dict[str, dict[str, list[torch.Tensor]]] = {d: {} for d in variants}
    references = {d: variants[d]["hf"](ids, fed).logits for d in variants}  # also a warm-up
    cells = [(dtype, name) for dtype in variants for name in variants[dtype]]
    for round_ in range(args.rounds):
        shift = round_ % len(cells)
        order = cells[shift:] + cells[:shift]
        if round_ % 2:
            order.reverse()
        bandwidths.append(read_bandwidth(repeats=3))
        for dtype, name in order:
            run = variants[dtype][name](ids, fed)
            seconds[dtype][name].append(statistics.median(run.seconds))
            last_logits[dtype][name] = run.logits
            if run.logits:
                diff = max(
                    float((a - b).abs().max())
                    for a, b in zip(run.logits, references[dtype], strict=True)
                )
                diffs[dtype][name] = max(diff, diffs[dtype].get(name, 0.0))
                if dtype == "bfloat16" and "float32" in references:
                    diff = max(
                        float((a - b).abs().max())
                        for a, b in zip(run.logits, references["float32"], strict=True)
                    )
                    fp32_diffs[name] = max(diff, fp32_diffs.get(name, 0.0))
        print(
            f"round {round_ + 1}: "
            + ", ".join(f"{d} {n} {seconds[d][n][-1] * 1000:.0f}" for d, n in cells),
            flush=True,
        )
    sample_ms = sampling_ms(reference_model.config.vocab_size)
    load_after = os.getloadavg()
    bandwidths.append(read_bandwidth())
    bandwidth = max(bandwidths)  # the machine's, as near as a shared machine shows it
    floor_ms = {d: weight_bytes(m) / bandwidth * 1000 for d, m in models.items()}

    table: dict[str, dict[str, dict[str, Any]]] = {}
    for dtype in variants:
        base = statistics.median(seconds[dtype]["hf"])
        for name, values in seconds[dtype].items():
            median = statistics.median(values)
            table.setdefault(name, {})[dtype] = {
                "ms_per_token": median * 1000,
                "rounds_ms": [v * 1000 for v in values],
                "vs_hf": median / base,
                "vs_floor": median * 1000 / floor_ms[dtype],
                "max_abs_logit_diff": diffs[dtype].get(name),
            }
    print(
        f"\nmedian ms/token over {args.rounds} rounds of {args.tokens} steps (each round's"
        f" median step); load average {load_before[0]:.1f} -> {load_after[0]:.1f}"
    )
    print(
        f"read bandwidth, best of the run: {bandwidth / 1e9:.1f} GB/s; floor "
        + ", ".join(f"{d} {ms:.1f} ms" for d, ms in floor_ms.items())
    )
    header = f"{'variant':24s}" + "".join(
        f"{dtype + ' ms':>15s}{'vs hf':>7s}{'x floor':>8s}{'max diff':>10s}" for dtype in variants
    )
    print(header)
    for name, per_dtype in table.items():
        line = f"{name:24s}"
        for dtype in variants:
            cell = per_dtype[dtype]
            diff = cell["max_abs_logit_diff"]
            line += f"{cell['ms_per_token']:15.1f}{cell['vs_hf']:6.2f}x{cell['vs_floor']:7.2f}x" + (
                f"{diff:10.1e}" if diff is not None else f"{'-':>10s}"
            )
        print(line)
    print(f"sampler (policy.sampling.sample, 1 row): {sample_ms:.2f} ms/token")
    if fp32_diffs:
        print(
            "bfloat16 variants against hf float32, max abs logit diff: "
            + ", ".join(f"{name} {diff:.2f}" for name, diff in fp32_diffs.items())
        )
    for dtype in variants:
        engine_ms = table["engine"][dtype]["ms_per_token"]
        matmul_ms = table["matmuls only"][dtype]["ms_per_token"]
        print(
            f"{dtype}: matmuls alone {matmul_ms:.1f} ms = {matmul_ms / engine_ms:.0%} of the"
            f" engine's step; everything else {engine_ms - matmul_ms:.1f} ms"
        )
    before_after = compare_before(seconds, last_logits) if baseline else {}
    for key, cell in before_after.items():
        print(
            f"{key} / before: {cell['ratio_of_medians']:.3f}x (per-round ratios"
            f" {', '.join(f'{r:.3f}' for r in cell['round_ratios'])}; median"
            f" {cell['median_round_ratio']:.3f}x); max abs logit difference"
            f" {cell['max_abs_logit_diff']:.1e}"
        )

    if args.json:
        figures = {
            "model": DEFAULT_MODEL,
            "torch": torch.__version__,
            "threads": args.threads,
            "tokens": args.tokens,
            "prompt_tokens": args.prompt,
            "rounds": args.rounds,
            "load_average": [load_before[0], load_after[0]],
            "read_bandwidth_gb_s": bandwidth / 1e9,
            "read_bandwidth_each_gb_s": [b / 1e9 for b in bandwidths],
            "floor_ms": floor_ms,
            "compile": compile_s,
            "profiles": profiles,
            "variants": table,
            "sampler_ms": sample_ms,
            "bf16_vs_fp32_max_abs_logit_diff": fp32_diffs,
            "clock": args.clock,
            "engine_vs_engine_before": before_after,
        }
        with open(args.json, "w") as file:
            json.dump(figures, file, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
