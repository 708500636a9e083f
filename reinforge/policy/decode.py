"""The built-in engine's decode step for Llama-shaped models, written out in torch.

At small batch much of a decode step can be per-op overhead: transformers' forward calls
~1,800 ops from Python for SmolLM2-135M, building a 4-D mask, computing the rotary
embedding, repeating key/value heads and reshaping for a sequence of one
(`benchmarks/README.md`, "The built-in engine at batch 1"). This step computes the same
function with ~1,300 (~1,500 in bf16, whose attention is two matmuls, `_attend`): rotary
cos and sin come from a table by position, the mask is made additive once per step, the
query heads of a key/value head attend as one group, temporaries are changed in place and
the residuals are added inside the matmuls. It reads the model's own parameters, or copies
made again when they change (below), so in-place updates, the shared trainer's optimizer
step included, are seen by the next step, and it appends to the same KV cache. The engine
uses it for every decode step and keeps transformers' forward for prefills. Models of any
other shape, or wrapped (a LoRA model), keep transformers' forward.

On an x86 CPU with AVX-512, where torch hands bf16 matmuls to oneDNN, each matmul reads
its weight from a copy in oneDNN's blocked layout (`benchmarks/README.md`, "Weights laid
out once"). In bf16 torch's own linear lays the weight out so at every call, about half
of a batch-1 matmul's time, and the copy gives the same logits bit for bit where
measured; in fp32 oneDNN's kernels on the copy beat MKL's from two rows up (a 32-row
step 0.7-0.8x), rounding otherwise (logits within 1e-4). A copy is laid out again when
its weight changes, by the first decode step after the change: laid out instead by the
thread that synced, a served fp32 engine's peak memory after syncs rose by about the
weights' size again (3.07 against 2.52 GiB). It costs a second copy of the linear
weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaForCausalLM, PreTrainedModel
from transformers.cache_utils import Cache

from reinforge.policy.kv_cache import RoomyLayer, cache_keyword

DecodeStep = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Cache], torch.Tensor]
"""(ids (B,), mask (B, L), positions (B, 1), cache) -> logits (B, V), the cache appended:
one token per running row, as `LlamaDecoder.__call__` describes."""


class _Matmul:
    """One linear layer as the step multiplies by it: its own weight, or the weight's
    blocked copy (the module docstring), laid out again whenever the weight's version
    counter or storage moves (a weight sync's copy, an optimizer step, `.data` replaced).
    A write that bumps neither goes unseen: one through `.data`, or a fused optimizer's
    step (torch's `fused=True` AdamW), after which the trainer bumps the versions itself."""

    def __init__(self, layer: nn.Linear, blocked: bool) -> None:
        self.layer = layer
        self.blocked = blocked
        self._copy: torch.Tensor | None = None
        # The weight the copy was made from, held so that no later tensor takes its address
        # (a `.data` replaced keeps the version count: only the address would tell), and
        # its version then (`_source` shares the live counter).
        self._source: torch.Tensor | None = None
        self._version = 0
        if blocked:
            self.laid_out()  # now, so the engine's memory budget sees the copy

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """layer(h)."""
        if not self.blocked:
            return F.linear(h, self.layer.weight, self.layer.bias)
        blocked, bias = self.laid_out(), self.layer.bias
        return torch.ops.mkldnn._linear_pointwise(h, blocked, bias, "none", [], "")

    def add(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """x + layer(h), the residual added inside the matmul."""
        residual = x if self.layer.bias is None else x + self.layer.bias
        if not self.blocked:
            return torch.addmm(residual, h, self.layer.weight.t())
        return torch.ops.mkldnn._linear_pointwise.binary(h, residual, self.laid_out(), None, "add")

    def laid_out(self) -> torch.Tensor:
        """The blocked copy of the weight as it is now."""
        weight, source = self.layer.weight, self._source
        if (
            self._copy is not None
            and source is not None
            and weight.data_ptr() == source.data_ptr()
            and weight._version == self._version
        ):
            return self._copy
        self._source, self._version = weight.detach(), weight._version
        self._copy = torch.ops.mkldnn._reorder_linear_weight(self._source, None)
        return self._copy


def lays_out_weights(weights: list[torch.Tensor]) -> bool:
    """Whether the step multiplies by blocked copies of `weights`: fp32 or bf16 on an x86
    CPU with AVX-512, where torch hands bf16 matmuls to oneDNN and both dtypes were
    measured to gain (elsewhere, AVX2 x86 or ARM, nothing was measured). Not for tensors
    made under `torch.inference_mode`, which keep no version counter to tell a change by."""
    return (
        torch.backends.mkldnn.is_available()
        and torch.backends.cpu.get_cpu_capability() == "AVX512"
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        and all(
            weight.dtype in (torch.float32, torch.bfloat16)
            and weight.device.type == "cpu"
            and not weight.is_inference()
            for weight in weights
        )
    )


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's norms and matmuls; their parameters are read at each call."""

    norm1: nn.Module
    q: _Matmul
    k: _Matmul
    v: _Matmul
    o: _Matmul
    norm2: nn.Module
    gate: _Matmul
    up: _Matmul
    down: _Matmul


class LlamaDecoder:
    """One token per row through a `LlamaForCausalLM`, as its forward computes it with a
    cache: RMSNorm in float32, rotary embeddings from the model's own rotary module (any
    rope scaling it has), grouped-query attention over the cached columns the mask keeps."""

    def __init__(self, model: LlamaForCausalLM, blocked: bool | None = None) -> None:
        """`blocked`: whether matmuls read blocked copies of the weights (the module
        docstring); None: where `lays_out_weights` says they pay."""
        config = model.config
        self.model = model
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        if blocked is None:
            linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
            blocked = lays_out_weights([linear.weight for linear in linears])

        def matmul(layer: nn.Linear) -> _Matmul:
            return _Matmul(layer, blocked)

        self.layers = [
            _Layer(
                block.input_layernorm,
                matmul(block.self_attn.q_proj),
                matmul(block.self_attn.k_proj),
                matmul(block.self_attn.v_proj),
                matmul(block.self_attn.o_proj),
                block.post_attention_layernorm,
                matmul(block.mlp.gate_proj),
                matmul(block.mlp.up_proj),
                matmul(block.mlp.down_proj),
            )
            for block in model.model.layers
        ]
        # The vocabulary projection is a fifth of the weights: blocked too, where the
        # others are, which skips the head module's hooks as the layers' matmuls do.
        self.head: Callable[[torch.Tensor], torch.Tensor] = (
            matmul(model.lm_head) if blocked else model.lm_head
        )
        self.rotary = _Rotary(model.model.rotary_emb)
        # bf16 attention on CPU as two matmuls (`_attend`); elsewhere torch's fused kernel.
        self.by_matmuls = model.dtype == torch.bfloat16 and model.device.type == "cpu"

    def __call__(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Cache
    ) -> torch.Tensor:
        """Feed `ids` (B,) at `positions` (B, 1) after the `cache`d columns; `mask` (B, L)
        marks the real columns, the new one last. Appends each layer's new key and value to
        `cache`; returns the logits (B, V)."""
        rows, kv_heads, dim = ids.shape[0], self.kv_heads, self.head_dim
        group = self.heads // kv_heads
        x = self.model.model.embed_tokens(ids)  # (B, H)
        cos, sin = self.rotary(x, positions, mask.shape[1])  # (B, 1, 1, D) each, x's dtype
        keep = _Bias(mask, x.dtype)
        for index, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.norm1.weight, self.eps)
            # The query heads sharing a key/value head are that head's "query positions":
            # the same sums as repeating keys and values per query head, without the copy.
            q = _rotate(layer.q(h).view(rows, kv_heads, group, dim), cos, sin)
            k = _rotate(layer.k(h).view(rows, kv_heads, 1, dim), cos, sin)
            v = layer.v(h).view(rows, kv_heads, 1, dim)
            keys, values = cache.update(k, v, index)  # (B, Hk, L, D) each
            if self.by_matmuls:
                states = cache.layers[index]
                assert isinstance(states, RoomyLayer), "the step appends to a `roomy_cache`"
                keys, values, start = states.whole_rows()  # (B, Hk, W, D) each
                bias = keep.over(start, keys.shape[-2])  # (B, 1, 1, W) or None
                attended = _attend(q, keys, values, bias, dim**-0.5)  # (B, Hk, G, D)
            else:
                bias = keep.over(0, keys.shape[-2])  # (B, 1, 1, L) or None
                attended = F.scaled_dot_product_attention(
                    q, keys, values, attn_mask=bias, scale=dim**-0.5
                )
            x = layer.o.add(x, attended.reshape(rows, self.heads * dim))
            h = _rms_norm(x, layer.norm2.weight, self.eps)
            gated = F.silu(layer.gate(h), inplace=True).mul_(layer.up(h))
            x = layer.down.add(x, gated)
        return self.head(_rms_norm(x, self.model.model.norm.weight, self.eps))


class _Rotary:
    """The model's rotary cos and sin at each row's position, looked up in a table of the
    rotary module's own output for many positions at once, so a step does not call the
    module (~10 ops) and any rope scaling the module applies is kept exactly.

    Rope types that recompute their frequencies from the batch's longest position (dynamic,
    longrope) call the module every step instead. The sin is returned with its first half
    negated: `_rotate` then rolls where rotate_half takes two slices, a negation and a cat,
    for the same products (only their signs move).
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        kind = getattr(module, "rope_type", "default")
        self.tabled = isinstance(kind, str) and "dynamic" not in kind and kind != "longrope"
        self.table: torch.Tensor | None = None  # (T, 2, D): cos and signed sin by position

    def __call__(
        self, x: torch.Tensor, positions: torch.Tensor, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin (B, 1, 1, D) in x's dtype at `positions` (B, 1), each below
        `width`."""
        if not self.tabled:
            cos, sin = _signed(*self.module(x, positions))  # (B, 1, D) each
            return cos.unsqueeze(1), sin.unsqueeze(1)
        rows = self._table(x, width).index_select(0, positions.view(-1))  # (B, 2, D)
        cos, sin = rows[:, :, None, None].unbind(1)
        return cos, sin

    def _table(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """The table in x's dtype and device with at least `width` positions: made again,
        twice as long, when a position passes its end."""
        table = self.table
        if table is None or table.dtype != x.dtype or table.device != x.device:
            length = width
        elif len(table) < width:
            length = max(width, 2 * len(table))
        else:
            return table
        positions = torch.arange(length, device=x.device)[None]  # (1, T)
        cos, sin = _signed(*self.module(x, positions))  # (1, T, D) each
        self.table = torch.stack([cos[0], sin[0]], dim=1)
        return self.table


def decode_step(model: PreTrainedModel) -> DecodeStep:
    """The engine's decode step for `model`: the written-out one for a plain Llama model,
    transformers' forward for any other."""
    decoder = llama_decoder(model)
    if decoder is not None:
        return decoder
    keyword = cache_keyword(model)  # read once: not per decode step

    def forward(
        ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Cache
    ) -> torch.Tensor:
        return model(
            input_ids=ids.unsqueeze(1),  # (B, 1)
            attention_mask=mask,
            position_ids=positions,
            **{keyword: cache},
            use_cache=True,
        ).logits[:, -1]

    return forward


def llama_decoder(model: PreTrainedModel) -> LlamaDecoder | None:
    """The written-out step for a plain Llama model; None for anything else."""
    config = model.config
    plain = (
        type(model) is LlamaForCausalLM
        and config.hidden_act == "silu"
        and getattr(config, "pretraining_tp", 1) == 1
    )
    return LlamaDecoder(model) if plain else None


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm: normalised in float32, cast back before the weight. (Its temporaries
    are changed in place: the same numbers with fewer allocations.)"""
    if x.dtype == torch.float32:  # no casts to dispatch
        return weight * (x * x.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_())
    x32 = x.float()
    x32.mul_(x32.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_())
    return weight * x32.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of heads (B, Hk, N, D) at one position per row; cos and sin
    (B, 1, 1, D), sin with its first half negated: rotate_half(x) * sin is x rolled by D/2
    times that."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


def _signed(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, and sin with the first half of its last dimension negated, as `_rotate` takes."""
    half = sin.shape[-1] // 2
    return cos, torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def _attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Attention of a step's few queries per key/value head (B, Hk, G, D) over the cache's
    whole rows (`RoomyLayer.whole_rows`), as two batched matmuls around a softmax.

    In bf16 on CPU, torch's fused attention took ~2 ms a layer at 12 rows of 1,500 columns,
    two thirds of the decode step; these matmuls take about half that, reading the rows in
    place (`benchmarks/README.md`, "Attention of a bf16 decode step"). In float32 the fused
    kernel is as fast, and the step keeps it. The scores are rounded to bf16 before the
    softmax (which runs in float32), where the fused kernel keeps them in float32: against
    a float32 model the logits' KL is the same either way, the weights' and activations'
    own rounding being far larger.
    """
    scores = torch.matmul(q * scale, keys.transpose(-1, -2))  # (B, Hk, G, L)
    if bias is not None:
        scores.add_(bias)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
    return torch.matmul(probs, values)  # (B, Hk, G, D)


class _Bias:
    """A step's mask of kept columns (B, L) as attention adds it to the scores over the
    cache's whole rows (`RoomyLayer.whole_rows`): 0 on kept columns; -inf on padding and
    on the columns around the states. Made once per step for each place the states lie in
    their rooms (one place in every layer, as a rule), not by attention in every layer."""

    def __init__(self, mask: torch.Tensor, dtype: torch.dtype) -> None:
        self.mask = mask
        self.dtype = dtype
        self._made: dict[tuple[int, int], torch.Tensor | None] = {}

    def over(self, start: int, width: int) -> torch.Tensor | None:
        """(B, 1, 1, width) for states at columns `start`.. of `width`; None where every
        column is kept."""
        if (start, width) not in self._made:
            self._made[start, width] = self._make(start, width)
        return self._made[start, width]

    def _make(self, start: int, width: int) -> torch.Tensor | None:
        rows, length = self.mask.shape
        if start + length > width:
            raise ValueError(f"{length} columns from {start} do not fit rows of {width}")
        if start == 0 and width == length and bool(self.mask.all()):
            return None
        bias = torch.full((rows, width), float("-inf"), dtype=self.dtype, device=self.mask.device)
        bias[:, start : start + length].masked_fill_(self.mask != 0, 0.0)
        return bias[:, None, None, :]
