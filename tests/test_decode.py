"""The engine's written-out Llama decode step: transformers' logits and cache, left padding
and all, for the model as it is now (weights changed in place included)."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from reinforge.policy.batch import Batch, layout
from reinforge.policy.decode import (
    LlamaDecoder,
    _Rotary,
    _rotate,
    decode_step,
    llama_decoder,
)
from reinforge.policy.kv_cache import ROOM, cache_keyword, roomy_cache
from reinforge.policy.models import load_model


def _llama(**overrides: object) -> LlamaForCausalLM:
    """Grouped-query attention (4 query heads per key/value head), biases, rope scaling."""
    config = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        attention_bias=True,
        mlp_bias=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**(config | overrides)))
    with torch.no_grad():  # biases start at 0: make them count
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(std=0.1)
    return model.eval()


def _models() -> dict[str, LlamaForCausalLM]:
    tiny = load_model("tiny-random")[0]
    assert isinstance(tiny, LlamaForCausalLM)
    return {"tiny-random": tiny, "gqa, biases, llama3 rope": _llama()}


def _decode_both(
    model: LlamaForCausalLM,
    prompts: list[list[int]],
    steps: int,
    decoder: LlamaDecoder | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Prefill `prompts` left-padded, then feed the same tokens `steps` times through
    transformers' forward and through the written-out step (`decoder`, or one made now),
    each on its own cache. Returns both logits per step and, per layer, both caches' keys
    at the end."""
    decoder = decoder or llama_decoder(model)
    assert decoder is not None
    keyword = cache_keyword(model)
    ids, mask = layout(prompts, [0] * len(prompts), 0, torch.device("cpu"))
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    caches = [roomy_cache(), roomy_cache()]
    theirs, ours = [], []
    with torch.inference_mode():
        for cache in caches:
            model(input_ids=ids, attention_mask=mask, position_ids=positions, **{keyword: cache})
        generator = torch.Generator().manual_seed(1)
        for _ in range(steps):
            token = torch.randint(0, model.config.vocab_size, (len(prompts),), generator=generator)
            mask = torch.cat([mask, torch.ones((len(prompts), 1), dtype=mask.dtype)], dim=1)
            position = mask.sum(dim=1, keepdim=True) - 1  # (B, 1)
            theirs.append(
                model(
                    input_ids=token.unsqueeze(1),
                    attention_mask=mask,
                    position_ids=position,
                    **{keyword: caches[0]},
                ).logits[:, -1]
            )
            ours.append(decoder(token, mask, position, caches[1]))
    keys = [(a.keys, b.keys) for a, b in zip(caches[0].layers, caches[1].layers, strict=True)]
    return theirs, ours, keys


@pytest.mark.parametrize("name", ["tiny-random", "gqa, biases, llama3 rope"])
@pytest.mark.parametrize(
    "prompts",
    [[[5, 6, 7, 8, 9]], [[5, 6, 7], [10, 11, 12, 13, 14, 15, 16], [20]]],
    ids=["one row, no padding", "left-padded rows"],
)
def test_the_written_out_step_gives_transformers_logits_and_cache(
    name: str, prompts: list[list[int]]
) -> None:
    theirs, ours, keys = _decode_both(_models()[name], prompts, steps=6)
    for expected, actual in zip(theirs, ours, strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    for expected, actual in keys:
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "prompts",
    [[[5, 6, 7, 8, 9]], [[5, 6, 7], [10, 11, 12, 13, 14]]],
    ids=["one row, no padding", "left-padded rows"],
)
def test_bfloat16_steps_stay_within_its_rounding(prompts: list[list[int]]) -> None:
    model = _llama().to(torch.bfloat16)
    theirs, ours, keys = _decode_both(model, prompts, steps=4)
    for expected, actual in zip(theirs, ours, strict=True):
        assert actual.dtype == expected.dtype == torch.bfloat16
        torch.testing.assert_close(actual.float(), expected.float(), rtol=0.05, atol=0.05)
    for expected, actual in keys:
        torch.testing.assert_close(actual.float(), expected.float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rotation_gives_transformers_numbers_exactly(dtype: torch.dtype) -> None:
    """A roll against a sin with its first half negated, for rotate_half's slices and cat:
    the same products, bit for bit."""
    model = _llama().to(dtype)
    positions = torch.tensor([[3], [40], [0]])  # (B, 1)
    torch.manual_seed(0)
    q = torch.randn(3, 2, 4, 8).to(dtype)  # (B, Hk, G, D)
    k = torch.randn(3, 2, 1, 8).to(dtype)
    cos, sin = model.model.rotary_emb(q, positions)  # (B, 1, D)
    expected = apply_rotary_pos_emb(q, k, cos, sin)
    table_cos, signed_sin = _Rotary(model.model.rotary_emb)(q, positions, width=41)
    assert torch.equal(table_cos, cos.unsqueeze(1))
    for theirs, ours in zip(expected, (q, k), strict=True):
        assert torch.equal(_rotate(ours, table_cos, signed_sin), theirs)


def test_the_rotary_table_grows_and_stays_the_modules_output() -> None:
    model = _llama()
    decoder = llama_decoder(model)
    assert decoder is not None and decoder.rotary.tabled
    theirs, ours, _ = _decode_both(model, [[5, 6, 7], [8]], steps=3, decoder=decoder)
    first = decoder.rotary.table
    assert first is not None
    # Later steps pass the table's end (positions past the first steps' mask width).
    theirs, ours, _ = _decode_both(model, [[5, 6, 7], [8]], steps=2 * len(first), decoder=decoder)
    for expected, actual in zip(theirs, ours, strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    table = decoder.rotary.table
    assert table is not None and len(table) > len(first)
    positions = torch.arange(len(table))[None]
    cos, sin = model.model.rotary_emb(table, positions)  # (1, T, D) each
    assert torch.equal(table[:, 0], cos[0])
    assert torch.equal(table[:, 1].abs(), sin[0].abs())


def test_a_rope_that_rescales_with_the_length_calls_its_module_every_step() -> None:
    """Dynamic rope recomputes its frequencies from the longest position: no table holds
    them, so each step asks the module, as transformers' forward does."""
    model = _llama(rope_scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=8)
    decoder = llama_decoder(model)
    assert decoder is not None and not decoder.rotary.tabled
    theirs, ours, _ = _decode_both(model, [[5, 6, 7], [8, 9, 10, 11, 12]], steps=6)
    for expected, actual in zip(theirs, ours, strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def test_weights_changed_in_place_are_used_at_once() -> None:
    """The shared trainer steps the engine's own tensors: no copy may go stale."""
    model = _llama()
    decoder = llama_decoder(model)  # made before the change
    before, _, _ = _decode_both(model, [[3, 4, 5], [6]], steps=2, decoder=decoder)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    theirs, ours, _ = _decode_both(model, [[3, 4, 5], [6]], steps=2, decoder=decoder)
    for old, expected, actual in zip(before, theirs, ours, strict=True):
        assert not torch.allclose(old, expected, atol=1e-3)  # the change shows
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


onednn = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="this CPU's oneDNN does not multiply bf16",
)


@onednn
@pytest.mark.parametrize(
    "prompts",
    [[[5, 6, 7, 8, 9]], [[5, 6, 7], [10, 11, 12, 13, 14]]],
    ids=["one row, no padding", "left-padded rows"],
)
def test_bf16_weights_laid_out_once_multiply_as_torchs_own_matmuls(
    prompts: list[list[int]],
) -> None:
    """Blocked copies (biases, residuals added in the matmul, the head) give the plain
    step's logits and cache: the same products, in oneDNN's weight layout."""
    model = _llama().to(torch.bfloat16)
    blocked = LlamaDecoder(model, blocked=True)
    assert all(layer.down._copy is not None for layer in blocked.layers)  # laid out at once
    _, plain, plain_keys = _decode_both(model, prompts, 4, LlamaDecoder(model, blocked=False))
    _, ours, our_keys = _decode_both(model, prompts, 4, blocked)
    for expected, actual in zip(plain, ours, strict=True):
        assert actual.dtype == torch.bfloat16
        torch.testing.assert_close(actual.float(), expected.float(), rtol=0.0, atol=0.01)
    for (_, expected), (_, actual) in zip(plain_keys, our_keys, strict=True):
        torch.testing.assert_close(actual.float(), expected.float(), rtol=0.0, atol=0.01)


@onednn
def test_laid_out_weights_follow_a_change_in_place() -> None:
    """A weight sync copies into the engine's tensors: the next step lays them out again."""
    model = _llama().to(torch.bfloat16)
    decoder = LlamaDecoder(model, blocked=True)
    before, _, _ = _decode_both(model, [[3, 4, 5], [6]], steps=2, decoder=decoder)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter + torch.randn_like(parameter) * 0.05)
    theirs, ours, _ = _decode_both(model, [[3, 4, 5], [6]], steps=2, decoder=decoder)
    for old, expected, actual in zip(before, theirs, ours, strict=True):
        assert not torch.allclose(old.float(), expected.float(), atol=0.1)  # the change shows
        torch.testing.assert_close(actual.float(), expected.float(), rtol=0.05, atol=0.05)


@onednn
def test_weights_replaced_through_data_are_laid_out_again() -> None:
    """A round trip through bf16 replaces every `.data` twice (as `model.to` does): the
    new tensors keep the version count, so only their storage tells."""
    model = _llama()
    decoder = LlamaDecoder(model, blocked=True)
    _decode_both(model, [[3, 4, 5]], steps=1, decoder=decoder)
    for dtype in (torch.bfloat16, torch.float32):  # every weight rounded to bf16
        for parameter in model.parameters():
            parameter.data = parameter.data.to(dtype)
    _, ours, _ = _decode_both(model, [[3, 4, 5], [6]], steps=2, decoder=decoder)
    fresh = LlamaDecoder(model, blocked=True)
    _, expected, _ = _decode_both(model, [[3, 4, 5], [6]], steps=2, decoder=fresh)
    for theirs, actual in zip(expected, ours, strict=True):
        assert torch.equal(actual, theirs)


def test_other_models_keep_transformers_forward() -> None:
    lora = get_peft_model(_llama(), LoraConfig(r=2, target_modules=["q_proj"]))
    assert llama_decoder(lora) is None  # adapters live in the wrapped forward
    qwen = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=100,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    assert llama_decoder(qwen) is None
    # Their decode step is transformers' forward, fed as the engine feeds it.
    prompt = torch.tensor([[5, 6, 7]])
    with torch.inference_mode():
        cache = roomy_cache()
        qwen(input_ids=prompt, **{cache_keyword(qwen): cache})
        mask = torch.ones((1, 4), dtype=torch.long)
        logits = decode_step(qwen)(torch.tensor([8]), mask, torch.tensor([[3]]), cache)
        expected = qwen(input_ids=torch.tensor([[5, 6, 7, 8]])).logits[:, -1]
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-5)


def _race(
    model: LlamaForCausalLM, prompts: list[list[int]], by_copy: bool
) -> dict[int, list[torch.Tensor]]:
    """Rows join (half prefilled first, the rest merged after two steps) and leave (rows
    1 and 3 after four steps, then row 0), decoding through the written-out step on a
    `Batch`; each row's logits per step. `by_copy` replaces the cache's states by copies
    after each join and before each retire, so that rows join and are cut in new tensors,
    as before the room kept them."""
    decoder = llama_decoder(model)
    assert decoder is not None
    batch: Batch[int] = Batch()
    logits: dict[int, list[torch.Tensor]] = {row: [] for row in range(len(prompts))}
    generator = torch.Generator().manual_seed(1)

    def join(rows: list[int]) -> None:
        ids, mask = layout([prompts[r] for r in rows], [0] * len(rows), 0, torch.device("cpu"))
        cache = roomy_cache()
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        keyword = cache_keyword(model)
        model(input_ids=ids, attention_mask=mask, position_ids=positions, **{keyword: cache})
        batch.merge(rows, cache, mask)
        if by_copy:  # as joining by `cat` left them: new tensors, no room
            _copy_states(batch)

    def step() -> None:
        token = torch.randint(
            0, model.config.vocab_size, (len(batch.requests),), generator=generator
        )
        batch.mask = torch.cat([batch.mask, torch.ones((len(token), 1), dtype=torch.long)], 1)
        position = batch.mask.sum(dim=1, keepdim=True) - 1
        assert batch.cache is not None
        out = decoder(token, batch.mask, position, batch.cache)
        for row, row_logits in zip(batch.requests, out, strict=True):
            logits[row].append(row_logits)

    def retire(rows: list[int]) -> None:
        if by_copy:
            _copy_states(batch)
        batch.retire([batch.requests.index(row) for row in rows])

    with torch.inference_mode():
        join(list(range(len(prompts) // 2)))
        step(), step()
        join(list(range(len(prompts) // 2, len(prompts))))
        for _ in range(4):
            step()
        retire([1, 3])
        step(), step()
        retire([0])
        for _ in range(ROOM + 2):  # past the end of the room
            step()
    return logits


def _copy_states(batch: Batch[int]) -> None:
    """The cache's states replaced by contiguous copies: the layers' rooms let go."""
    assert batch.cache is not None
    for layer in batch.cache.layers:
        layer.keys = layer.keys.contiguous().clone()
        layer.values = layer.values.contiguous().clone()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "prompts",
    [[[5, 6, 7, 8]] * 6, [[5, 6, 7], [10, 11, 12, 13, 14, 15, 16], [20], [1, 2], [3] * 9, [4]]],
    ids=["no padding", "left-padded rows"],
)
def test_rows_joined_and_cut_inside_the_cache_room_give_the_same_logits_as_by_copy(
    dtype: torch.dtype, prompts: list[list[int]]
) -> None:
    """In bf16, attention in the room reads each row's whole room and masks the columns
    around its states (spare ones, and those of rows that left): the same sums with zeros
    added, which a vectorised reduction may round otherwise, so the logits agree to
    rounding. A column masked wrongly would move them far more."""
    model = _llama().to(dtype)
    in_room, by_copy = _race(model, prompts, by_copy=False), _race(model, prompts, by_copy=True)
    assert [len(steps) for steps in in_room.values()] == [8, 6, ROOM + 10, 4, ROOM + 8, ROOM + 8]
    tolerance = 1e-5 if dtype == torch.float32 else 0.05
    for row, steps in in_room.items():
        for ours, theirs in zip(steps, by_copy[row], strict=True):
            torch.testing.assert_close(ours, theirs, rtol=tolerance, atol=tolerance)
