"""The policy's log-probs of the sampled tokens, without materialising (B, T, V) logits.

The LM head is a large share of a small model's compute and memory (SmolLM2-135M: a 49k x
576 matrix, and full logits of a 16 x 1024 batch are 3 GiB in float32). RL needs the head
only where a sampled token is predicted, so `selective_logprobs` runs the decoder, gathers
the hidden states of those positions and applies the head to them alone, in chunks.

The rollouts of one group open with the same prompt, often most of a short episode's tokens
(an agent's system prompt and tool schemas). A micro-batch's shared prefix runs once, in
one row, and the rest of every row attends to its keys and values.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedModel

from reinforge.train.batching import TrainBatch
from reinforge.train.losses import token_entropy, token_logprobs

_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config fields of models whose forward changes the logits after the head (Gemma 2's
soft-capping, Cohere's and Granite's scaling), which applying the head alone would miss."""


def selective_logprobs(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    target_mask: Tensor,
    targets: Tensor,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    shared: int = 0,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of `targets` where `target_mask` is set, and optionally the entropy there.

    Equal (to float rounding) to `log_softmax(model(input_ids).logits)` gathered at the
    targets, and differentiable; 0 elsewhere, with no gradient path from there. The head
    runs on `chunk_size` positions at a time, in float32 for the softmax, and each chunk's
    logits are recomputed in backward rather than kept (`_HeadLogprobs`), so the head's
    memory is one chunk's logits however many tokens are trained: that costs one more head
    matmul per chunk in backward. The decoder's own activations are the caller's to
    checkpoint (`model.gradient_checkpointing_enable()`). Pinned by
    `test_selective_equals_full_logits_on_ragged_padding` and the gradient tests there.

    input_ids, attention_mask, target_mask, targets: (B, T), as in `TrainBatch`.
    shared: leading columns to run once for all rows, at most `TrainBatch.shared_prefix`;
    0 where the model recomputes its layers in backward (gradient checkpointing drops the
    keys and values a shared prefix leaves).
    Returns logprobs (B, T) and entropy (B, T) or None, both float32.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    _check_plain_head(model)
    if shared and model.is_gradient_checkpointing and model.training:
        raise ValueError("a shared prefix needs its keys and values: not under checkpointing")
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    hidden = _hidden_states(decoder, input_ids, attention_mask, shared)  # (B, T - shared, H)
    positions = target_mask[:, shared:].bool()  # (B, T - shared)
    selected = hidden[positions]  # (N, H), row-major order
    wanted = targets[:, shared:][positions]  # (N,)

    logps: list[Tensor] = []
    entropies: list[Tensor] = []
    # split gives one empty chunk when N = 0, so the result stays in the graph.
    for h, t in zip(selected.split(chunk_size), wanted.split(chunk_size), strict=True):
        logp, entropy = _HeadLogprobs.apply(h, head.weight, head.bias, t, with_entropy)
        logps.append(logp)  # (n,)
        if entropy is not None:
            entropies.append(entropy)  # (n,)

    # No target lies in the shared columns, so the row-major order is the whole batch's.
    everywhere = target_mask.bool()  # (B, T)
    logprobs = _scatter(everywhere, torch.cat(logps))  # (B, T)
    entropy = _scatter(everywhere, torch.cat(entropies)) if with_entropy else None  # (B, T)
    return logprobs, entropy


def _hidden_states(
    decoder: nn.Module, input_ids: Tensor, attention_mask: Tensor, shared: int
) -> Tensor:
    """The decoder's last hidden states (B, T - shared, H) of columns `shared` onwards.

    The first `shared` columns run once, as one row; their keys and values, expanded to
    every row without a copy, are the cache the rest of each row attends to, and backward
    reaches the prefix's weights through them. Equal to the whole rows' forward to float
    rounding (`test_a_shared_prefix_gives_the_plain_forwards_logprobs_and_gradients`).
    """
    if shared == 0:
        return decoder(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state  # (B, T, H)
    cache = decoder(input_ids=input_ids[:1, :shared], use_cache=True).past_key_values
    rows = input_ids.shape[0]
    for layer in cache.layers:
        layer.keys = layer.keys.expand(rows, -1, -1, -1)  # (B, kv heads, shared, d)
        layer.values = layer.values.expand(rows, -1, -1, -1)
    return decoder(
        input_ids=input_ids[:, shared:],
        attention_mask=attention_mask,  # (B, T): the cached columns and the rest
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state  # (B, T - shared, H)


class SelectiveLogprobs(nn.Module):
    """`selective_logprobs` of a model as one module call.

    `selective_logprobs` runs the decoder and the head apart, never the model's own forward,
    so a sharded model (FSDP) would never gather the weights its root unit holds (embedding,
    final norm, head); made the root unit, this module's forward gathers them around both.
    The trainer calls its model through it whether sharded or not: one code path.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, batch: TrainBatch, with_entropy: bool = False, share_prefix: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs (B, T) of `batch.targets` and entropy (B, T) or None, as
        `selective_logprobs`, the batch's shared prefix run once with `share_prefix`."""
        return selective_logprobs(
            self.model,
            batch.input_ids,
            batch.attention_mask,
            batch.target_mask,
            batch.targets,
            with_entropy=with_entropy,
            shared=batch.shared_prefix if share_prefix else 0,
        )


class _HeadLogprobs(torch.autograd.Function):
    """The head's log-probs of the targets (n,) and entropies (n,) or None, from hidden
    states (n, H); backward recomputes the logits from the hidden states.

    Autograd through the head would keep the (n, V) logits and log-softmax for backward,
    and activation checkpointing would redo the whole forward, entropy included, before
    its own backward. Here the forward keeps only each position's log-normaliser, and
    backward recomputes the logits with one head matmul and turns them into their
    gradient in place: d logp_t / dz = onehot(t) - p and dH / dz = -p (log p + H).

    The logits are float32 even under bf16 autocast: bf16 logits of magnitude ~20 are off
    by ~0.1, which would show up as importance ratios of e^0.1 against the sampler's.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor | None]:
        with torch.autocast(hidden.device.type, enabled=False):
            logits = F.linear(hidden, weight, bias).float()  # (n, V)
        logp = token_logprobs(logits, targets)  # (n,)
        entropy = token_entropy(logits) if with_entropy else None  # (n,)
        normaliser = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logp  # (n,)
        ctx.save_for_backward(hidden, weight, bias, targets, normaliser, entropy)
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_logp: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, targets, normaliser, entropy = ctx.saved_tensors
        if grad_logp is None:  # only the entropy is used
            grad_logp = torch.zeros_like(normaliser)
        with torch.autocast(hidden.device.type, enabled=False):
            logp = F.linear(hidden, weight, bias).float()  # (n, V), logits for now
        logp -= normaliser.unsqueeze(-1)  # (n, V)
        grad = logp.exp()  # (n, V): p, then the gradient of the logits
        if grad_entropy is not None:
            logp += entropy.unsqueeze(-1)
            logp *= grad_entropy.unsqueeze(-1)  # (n, V): dL/dH (log p + H)
            logp += grad_logp.unsqueeze(-1)
            grad *= logp  # p (dL/dlogp + dL/dH (log p + H))
        else:
            grad *= grad_logp.unsqueeze(-1)
        del logp
        grad.neg_()
        grad.scatter_add_(-1, targets.unsqueeze(-1), grad_logp.unsqueeze(-1))
        grad = grad.to(hidden.dtype)
        needs = ctx.needs_input_grad
        return (
            grad @ weight if needs[0] else None,  # (n, H)
            grad.t() @ hidden if needs[1] else None,  # (V, H)
            grad.sum(dim=0) if bias is not None and needs[2] else None,  # (V,)
            None,
            None,
        )


def _scatter(positions: Tensor, values: Tensor) -> Tensor:
    """A float32 zero (B, T) holding `values` (N,) at `positions` (B, T), row-major."""
    zeros = torch.zeros(positions.shape, dtype=torch.float32, device=values.device)  # (B, T)
    return zeros.masked_scatter(positions, values)  # (B, T)


def _check_plain_head(model: PreTrainedModel) -> None:
    """Refuse models whose logits are more than a linear head's output."""
    head = model.get_output_embeddings()
    if type(head) is not nn.Linear:
        raise ValueError(
            f"{type(model).__name__}'s output head is a {type(head).__name__}: "
            "selective_logprobs applies the head as a plain linear layer"
        )
    config = model.config.get_text_config()
    for name in _LOGIT_TRANSFORMS:
        if getattr(config, name, None) not in (None, 1.0):
            raise ValueError(
                f"{type(model).__name__} sets {name}: its logits are transformed after the "
                "head, which selective_logprobs does not reproduce"
            )
