import asyncio
import time
from collections.abc import Iterator

import pytest
import torch

from reinforge.policy.config import EngineConfig
from reinforge.policy.engine import Engine
from reinforge.policy.models import load_model
from reinforge.policy.sampling import SamplingParams


def sampling(**settings: object) -> SamplingParams:
    """Plain sampling (temperature 1, top_p 1) with the given settings changed."""
    return SamplingParams(**{"max_tokens": 8, "temperature": 1.0, "top_p": 1.0, **settings})  # type: ignore[arg-type]


def teacher_forced_logprobs(engine, prompt: list[int], completion: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return (
        torch.log_softmax(logits.float(), dim=-1)
        .gather(1, torch.tensor(completion).unsqueeze(1))
        .squeeze(1)
    )


async def test_concurrent_requests_get_the_logprobs_of_their_own_context(tiny_engine):
    # Prompts of different lengths join the batch at different times; each completion's
    # log-probs must match a plain forward pass over that sequence alone.
    prompts = [list(range(5, 5 + n)) for n in (3, 11, 7, 20)]
    params = [sampling(max_tokens=m, seed=i) for i, m in enumerate((9, 4, 12, 6))]

    async def staggered(i: int):
        await asyncio.sleep(0.01 * i)
        return await tiny_engine.generate(prompts[i], params[i])

    completions = await asyncio.gather(*(staggered(i) for i in range(4)))
    for prompt, param, completion in zip(prompts, params, completions, strict=True):
        assert len(completion.token_ids) == param.max_tokens
        assert completion.finish_reason == "length"
        expected = teacher_forced_logprobs(tiny_engine, prompt, completion.token_ids)
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4)


async def test_seeded_requests_repeat(tiny_engine):
    prompt = [10, 20, 30]
    first = await tiny_engine.generate(prompt, sampling(max_tokens=6, seed=5))
    second = await tiny_engine.generate(prompt, sampling(max_tokens=6, seed=5))
    assert first.token_ids == second.token_ids


async def test_stop_string_ends_generation(tiny_engine):
    # Greedy decoding is deterministic: generate once, then stop at a piece of its text.
    prompt = [10, 20, 30]
    full = await tiny_engine.generate(prompt, sampling(max_tokens=8, temperature=0))
    text = tiny_engine.tokenizer.decode(full.token_ids[:3])
    stop = text[-3:]
    stopped = await tiny_engine.generate(
        prompt, sampling(max_tokens=8, temperature=0, stop=(stop,))
    )
    assert stopped.finish_reason == "stop" and stopped.stop_text == stop
    assert stopped.token_ids == full.token_ids[: len(stopped.token_ids)]
    assert len(stopped.token_ids) <= 3


async def test_update_weights_bumps_the_version_and_changes_the_policy(tiny_engine):
    prompt = [10, 20, 30]
    before = await tiny_engine.generate(prompt, sampling(max_tokens=4, temperature=0))
    version = tiny_engine.version
    name = "model.norm.weight"
    original = tiny_engine.model.get_parameter(name).detach().clone()
    try:
        # A zero final norm makes every logit 0, so greedy picks token 0 each time.
        assert tiny_engine.update_weights({name: torch.zeros_like(original)}) == version + 1
        after = await tiny_engine.generate(prompt, sampling(max_tokens=4, temperature=0))
        assert after.token_ids == [0] * 4 != before.token_ids
        assert after.policy_versions == [version + 1] * 4
    finally:
        tiny_engine.update_weights({name: original})


async def test_unknown_weight_names_are_refused(tiny_engine):
    try:
        tiny_engine.update_weights({"no.such.weight": torch.zeros(1)})
    except KeyError as error:
        assert "no.such.weight" in str(error)
    else:
        raise AssertionError("expected KeyError")


def test_identical_prompts_are_prefilled_once(tiny_engine):
    # Drive one prefill directly, so that all four requests are in it whatever the timing.
    from concurrent.futures import Future

    from reinforge.policy.engine import _Batch, _Request

    prompt = [11, 12, 13, 14]
    requests = [_Request(prompt, sampling(max_tokens=1, seed=s), Future()) for s in range(4)]
    requests.append(_Request([9, 8], sampling(max_tokens=1, seed=9), Future()))
    before = tiny_engine.stats.prefill_tokens
    with tiny_engine._lock, torch.inference_mode():
        tiny_engine._prefill(_Batch(), requests)
    assert tiny_engine.stats.prefill_tokens - before == len(prompt) + 2
    for request in requests:
        completion = request.future.result(timeout=0)
        expected = teacher_forced_logprobs(tiny_engine, request.prompt_ids, completion.token_ids)
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4)


async def test_a_continuation_reuses_cached_states_and_keeps_exact_logprobs(tiny_engine):
    first_prompt = list(range(40, 60))
    first = await tiny_engine.generate(first_prompt, sampling(max_tokens=5, seed=3))
    follow_up = first_prompt + first.token_ids + [7, 8, 9]
    cached_before = tiny_engine.stats.cached_tokens
    computed_before = tiny_engine.stats.prefill_tokens
    second = await tiny_engine.generate(follow_up, sampling(max_tokens=6, seed=4))
    # Everything but the last sampled token of the first turn was cached.
    assert tiny_engine.stats.cached_tokens - cached_before == len(first_prompt) + 4
    assert tiny_engine.stats.prefill_tokens - computed_before == 4
    expected = teacher_forced_logprobs(tiny_engine, follow_up, second.token_ids)
    assert torch.allclose(torch.tensor(second.logprobs), expected, atol=1e-4)


async def test_new_weights_drop_cached_states(tiny_engine):
    prompt = list(range(70, 90))
    first = await tiny_engine.generate(prompt, sampling(max_tokens=3, seed=1))
    name = "model.norm.weight"
    weight = tiny_engine.model.get_parameter(name).detach().clone()
    tiny_engine.update_weights({name: weight})  # same values, but a new policy version
    cached_before = tiny_engine.stats.cached_tokens
    await tiny_engine.generate(prompt + first.token_ids, sampling(max_tokens=2, seed=1))
    assert tiny_engine.stats.cached_tokens == cached_before


@pytest.fixture
def own_engine() -> Iterator[Engine]:
    """An engine of its own, for tests that change its weights mid-generation."""
    model, tokenizer = load_model("tiny-random")
    engine = Engine(model, tokenizer, "tiny-random", EngineConfig())
    yield engine
    engine.close()


def test_a_request_in_flight_across_an_update_keeps_exact_logprobs(own_engine):
    # A stale KV cache would feed old-weight states to new-weight steps: the tokens after
    # the update would then match neither policy.
    model = own_engine.model
    old = {name: p.detach().clone() for name, p in model.named_parameters()}
    noise = torch.Generator().manual_seed(0)
    new = {n: p + 0.05 * torch.randn(p.shape, generator=noise) for n, p in old.items()}
    prompt = list(range(5, 17))
    future = own_engine.submit(prompt, sampling(max_tokens=64, seed=7))
    while own_engine.stats.generated_tokens < 3:
        time.sleep(0.001)
    with own_engine.paused():  # a weight update may be nested in a pause
        assert not future.done()
        assert own_engine.update_weights(new) == 1
    completion = future.result(timeout=120)

    versions = completion.policy_versions
    old_tokens = versions.count(0)
    assert len(versions) == 64 and old_tokens >= 3
    assert versions == [0] * old_tokens + [1] * (64 - old_tokens)
    assert own_engine.stats.recomputed_tokens == len(prompt) + old_tokens - 1
    expected = {}
    for version, state in ((0, old), (1, new)):
        own_engine.update_weights(state)
        expected[version] = teacher_forced_logprobs(own_engine, prompt, completion.token_ids)
    per_token = torch.stack([expected[v][i] for i, v in enumerate(versions)])
    assert torch.allclose(torch.tensor(completion.logprobs), per_token, atol=1e-4)


def test_paused_engine_decodes_nothing_until_resumed(tiny_engine):
    with tiny_engine.paused():
        generated = tiny_engine.stats.generated_tokens
        future = tiny_engine.submit([10, 20, 30], sampling(max_tokens=4, seed=2))
        time.sleep(0.1)
        assert tiny_engine.stats.generated_tokens == generated and not future.done()
    assert len(future.result(timeout=60).token_ids) == 4


def test_weight_update_bumps_the_version_once_and_times_itself(tiny_engine):
    version, sync_s = tiny_engine.version, tiny_engine.stats.sync_s
    with tiny_engine.weight_update() as new_version:
        assert tiny_engine.version == version  # the version changes with the weights
    assert new_version == tiny_engine.version == version + 1
    assert tiny_engine.stats.sync_s > sync_s
    with pytest.raises(RuntimeError), tiny_engine.weight_update():
        raise RuntimeError("optimizer step failed")
    assert tiny_engine.version == version + 1
