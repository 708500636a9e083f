"""selective_logprobs against the full-logits computation, on a tiny random Llama.

The model here has an untied head (the `tiny-random` model of test_batching.py ties it).
"""

import pytest
import torch
from torch import Tensor
from transformers import LlamaConfig, LlamaForCausalLM

from reinforge.train.batching import TrainBatch
from reinforge.train.logprobs import selective_logprobs
from reinforge.train.losses import token_entropy, token_logprobs
from reinforge.types import Trajectory

VOCAB = 1000


def tiny_llama(**overrides: object) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        initializer_range=0.2,  # peaked next-token distributions, not near-uniform ones
        **overrides,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return LlamaForCausalLM(config)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_llama()


def episode(segments: list[tuple[int, bool]], seed: int) -> Trajectory:
    """Random tokens in segments of (length, sampled by the policy)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(VOCAB, (sum(n for n, _ in segments),), generator=generator)
    mask = [int(sampled) for n, sampled in segments for _ in range(n)]
    logprobs = [-1.0] * sum(mask)  # only their count matters here
    return Trajectory(
        task_id="t", group_id="g", token_ids=tokens.tolist(), loss_mask=mask, logprobs=logprobs
    )


def ragged_batch() -> TrainBatch:
    # Lengths 11, 6 and 14: right padding of 3, 8 and 0 columns. Row 0 ends with 3 tool
    # tokens after its last sampled span (a truncated episode): real inputs never trained on.
    return TrainBatch.from_trajectories(
        [
            episode([(3, False), (2, True), (2, False), (1, True), (3, False)], seed=1),
            episode([(4, False), (2, True)], seed=2),
            episode([(5, False), (4, True), (3, False), (2, True)], seed=3),
        ],
        advantages=[1.0, -1.0, 0.5],
    )


def full_logits_reference(model: LlamaForCausalLM, batch: TrainBatch) -> tuple[Tensor, Tensor]:
    """The straightforward way: every position's logits, then gather. (B, T) each, masked."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    mask = batch.target_mask  # (B, T)
    logp = torch.where(mask, token_logprobs(logits, batch.targets), 0.0)  # (B, T)
    entropy = torch.where(mask, token_entropy(logits), 0.0)  # (B, T)
    return logp, entropy


def selective(model: LlamaForCausalLM, batch: TrainBatch, chunk_size: int = 4, shared: int = 0):
    return selective_logprobs(
        model,
        batch.input_ids,
        batch.attention_mask,
        batch.target_mask,
        batch.targets,
        chunk_size=chunk_size,
        with_entropy=True,
        shared=shared,
    )


@pytest.mark.parametrize("chunk_size", [1, 4, 1024])  # 11 targets: 4 makes a partial chunk
def test_selective_equals_full_logits_on_ragged_padding(model, chunk_size):
    batch = ragged_batch()
    assert int(batch.target_mask.sum()) == 11
    logp, entropy = selective(model, batch, chunk_size)
    with torch.no_grad():
        full_logp, full_entropy = full_logits_reference(model, batch)
    assert entropy is not None
    torch.testing.assert_close(logp, full_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, full_entropy, atol=1e-5, rtol=0)
    # Exactly zero off the targets, and varied values on them (not a near-uniform head).
    assert logp[~batch.target_mask].eq(0).all() and entropy[~batch.target_mask].eq(0).all()
    assert logp[batch.target_mask].std() > 0.5


def test_entropy_only_when_asked_and_no_graph_under_no_grad(model):
    batch = ragged_batch()
    with torch.no_grad():  # how a reference model's log-probs are taken
        logp, entropy = selective_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.target_mask, batch.targets
        )
    assert entropy is None and not logp.requires_grad
    torch.testing.assert_close(logp, selective(model, batch)[0].detach(), atol=1e-6, rtol=0)


def _loss_and_grads(model, batch: TrainBatch) -> tuple[Tensor, list[Tensor]]:
    """A loss that uses every target's log-prob and entropy with different weights."""
    model.zero_grad()
    logp, entropy = selective(model, batch)
    coefficients = torch.linspace(-1.0, 1.0, logp.numel()).reshape(logp.shape)  # (B, T)
    loss = (coefficients * logp).sum() + 0.1 * (coefficients * entropy).sum()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_non_target_positions_leave_loss_and_gradients_bit_identical(model):
    batch = ragged_batch()
    loss, grads = _loss_and_grads(model, batch)

    # Change every target the mask ignores, and every input after each row's last trained
    # target (row 0's trailing tool tokens and all padding): none of them is a sampled
    # token or precedes one, so nothing trained may depend on them.
    generator = torch.Generator().manual_seed(7)
    noise = torch.randint(VOCAB, batch.input_ids.shape, generator=generator)  # (B, T)
    columns = torch.arange(batch.width)  # (T,)
    last_target = (batch.target_mask * columns).amax(dim=-1, keepdim=True)  # (B, 1)
    after = columns > last_target + 1  # (B, T), past the last sampled token
    assert after[0, 8:].all() and not after[0, 7]  # row 0: tool tokens 8-10, then padding
    changed = TrainBatch(
        input_ids=torch.where(after, noise, batch.input_ids),
        attention_mask=batch.attention_mask,
        target_mask=batch.target_mask,
        targets=torch.where(batch.target_mask, batch.targets, noise),
        behaviour_logprobs=batch.behaviour_logprobs,
        advantages=batch.advantages,
    )
    assert not changed.input_ids.equal(batch.input_ids)
    assert not changed.targets.equal(batch.targets)

    changed_loss, changed_grads = _loss_and_grads(model, changed)
    assert torch.equal(changed_loss, loss)
    for grad, changed_grad in zip(grads, changed_grads, strict=True):
        assert torch.equal(grad, changed_grad)
    assert all(grad.abs().sum() > 0 for grad in grads)  # every parameter took part


def test_gradient_equals_a_masked_full_logits_loss():
    # The full-logits loss is masked per token, so prompt, tool and padding positions' own
    # predictions get exactly zero gradient there; the selective loss must match it.
    # In float64, so that the float32 rounding of gradients of size ~6 (~1e-6 apart when
    # summed in another order) does not hide a real difference.
    model = tiny_llama().to(torch.float64)
    batch = ragged_batch()
    loss, grads = _loss_and_grads(model, batch)

    model.zero_grad()
    full_logp, full_entropy = full_logits_reference(model, batch)
    coefficients = torch.linspace(-1.0, 1.0, full_logp.numel()).reshape(full_logp.shape)
    full_loss = (coefficients * full_logp).sum() + 0.1 * (coefficients * full_entropy).sum()
    full_loss.backward()

    torch.testing.assert_close(loss, full_loss.detach(), atol=1e-5, rtol=0)
    for grad, param in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(grad, param.grad, atol=1e-6, rtol=0)


def test_no_target_gives_zeros_that_backpropagate(model):
    batch = ragged_batch()
    logp, _ = selective_logprobs(
        model,
        batch.input_ids,
        batch.attention_mask,
        torch.zeros_like(batch.target_mask),
        batch.targets,
    )
    assert logp.eq(0).all()
    model.zero_grad()
    logp.sum().backward()  # an empty micro-batch must not break gradient accumulation
    assert all(p.grad is None or p.grad.eq(0).all() for p in model.parameters())


def test_models_that_transform_their_logits_are_refused():
    batch = ragged_batch()
    capped = tiny_llama(final_logit_softcapping=30.0)
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        selective_logprobs(
            capped, batch.input_ids, batch.attention_mask, batch.target_mask, batch.targets
        )


def test_a_head_that_is_not_a_plain_linear_layer_is_refused():
    # Its weight alone would not give its output: the log-probs would be another model's.
    batch = ragged_batch()
    wrapped = tiny_llama()
    wrapped.lm_head = torch.nn.Sequential(wrapped.lm_head)
    with pytest.raises(ValueError, match="output head is a Sequential"):
        selective_logprobs(
            wrapped, batch.input_ids, batch.attention_mask, batch.target_mask, batch.targets
        )


def prompted_batch() -> TrainBatch:
    """Three rollouts of one 9-token prompt, ragged (lengths 15, 15 and 10): one samples
    its first token right after the prompt, one after two tool tokens, one stops early."""
    prompt = episode([(9, False)], seed=0)
    rollouts = [
        episode([(1, True), (3, False), (2, True)], seed=1),
        episode([(2, False), (4, True)], seed=2),
        episode([(1, True)], seed=3),
    ]
    return TrainBatch.from_trajectories(
        [
            Trajectory(
                task_id="t",
                group_id="g",
                token_ids=prompt.token_ids + rollout.token_ids,
                loss_mask=prompt.loss_mask + rollout.loss_mask,
                logprobs=rollout.logprobs,
            )
            for rollout in rollouts
        ],
        advantages=[1.0, -1.0, 0.5],
    )


def test_a_shared_prefix_gives_the_plain_forwards_logprobs_and_gradients():
    # In float64, as the masked full-logits test above (whose softmax is float32, hence
    # 1e-6): the prompt runs once, its keys and values feed the three rows, and backward
    # reaches the prompt's weights through them.
    model = tiny_llama().to(torch.float64)
    batch = prompted_batch()
    assert batch.shared_prefix == 8  # the 9th prompt token predicts row 0's first sample

    def loss_and_grads(shared: int) -> tuple[Tensor, Tensor, list[Tensor]]:
        model.zero_grad()
        logp, entropy = selective(model, batch, shared=shared)
        assert entropy is not None
        coefficients = torch.linspace(-1.0, 1.0, logp.numel()).reshape(logp.shape)  # (B, T)
        loss = (coefficients * logp).sum() + 0.1 * (coefficients * entropy).sum()
        loss.backward()
        return logp.detach(), loss.detach(), [p.grad.clone() for p in model.parameters()]

    plain_logp, plain_loss, plain_grads = loss_and_grads(0)
    logp, loss, grads = loss_and_grads(batch.shared_prefix)
    torch.testing.assert_close(logp, plain_logp, atol=1e-6, rtol=0)
    torch.testing.assert_close(loss, plain_loss, atol=1e-6, rtol=0)
    for grad, plain in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(grad, plain, atol=1e-6, rtol=0)
    assert all(grad.abs().sum() > 0 for grad in grads)  # the prompt's weights took part
    with torch.no_grad():
        full_logp, _ = full_logits_reference(model, batch)
    torch.testing.assert_close(logp, full_logp, atol=1e-6, rtol=0)


def test_a_shared_prefix_under_bf16_autocast_stays_within_its_rounding(model):
    batch = prompted_batch()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        shared, _ = selective_logprobs(
            model,
            batch.input_ids,
            batch.attention_mask,
            batch.target_mask,
            batch.targets,
            shared=batch.shared_prefix,
        )
    with torch.no_grad():
        plain, _ = full_logits_reference(model, batch)
    assert shared[~batch.target_mask].eq(0).all()
    torch.testing.assert_close(shared, plain, atol=0.1, rtol=0)  # bf16 matmuls, fp32 head


def test_a_shared_prefix_is_refused_where_layers_are_recomputed():
    model = tiny_llama()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = prompted_batch()
    with pytest.raises(ValueError, match="checkpointing"):
        selective_logprobs(
            model.train(),
            batch.input_ids,
            batch.attention_mask,
            batch.target_mask,
            batch.targets,
            shared=batch.shared_prefix,
        )
