"""The engines' guarantees: each completion's log-probs are those of a plain forward over
its own sequence, whatever shares its batch; new weights take effect between two decode
steps and every token carries the version that sampled it. The tests taking `any_engine`
run on the built-in engine and on vLLM; the rest test the built-in engine's own
batching and prefix cache."""

import asyncio
import time

import pytest
import torch

from reinforge.policy.engine_thread import Sampled
from reinforge.policy.sampling import SamplingParams

from .conftest import EngineUnderTest


def sampling(**settings: object) -> SamplingParams:
    """Plain sampling (temperature 1, top_p 1) with the given settings changed."""
    return SamplingParams(
        **{"max_tokens": 8, "temperature": 1.0, "top_p": 1.0, "stop_loops": False, **settings}
    )  # type: ignore[arg-type]


def teacher_forced_logprobs(engine, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """For the built-in engine's own tests: a forward of the engine's model."""
    return EngineUnderTest(engine, engine.model).forced_logprobs(prompt, completion)


async def test_concurrent_requests_get_the_logprobs_of_their_own_context(
    any_engine: EngineUnderTest,
):
    # Prompts of different lengths join the batch at different times; each completion's
    # log-probs must match a plain forward pass over that sequence alone.
    prompts = [list(range(5, 5 + n)) for n in (3, 11, 7, 20)]
    params = [sampling(max_tokens=m, seed=i) for i, m in enumerate((9, 4, 12, 6))]

    async def staggered(i: int):
        await asyncio.sleep(0.01 * i)
        return await any_engine.engine.generate(prompts[i], params[i])

    completions = await asyncio.gather(*(staggered(i) for i in range(4)))
    for prompt, param, completion in zip(prompts, params, completions, strict=True):
        assert len(completion.token_ids) == param.max_tokens
        assert completion.finish_reason == "length"
        expected = any_engine.forced_logprobs(prompt, completion.token_ids)
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4)


async def test_seeded_requests_repeat(any_engine: EngineUnderTest):
    prompt = [10, 20, 30]
    first = await any_engine.engine.generate(prompt, sampling(max_tokens=6, seed=5))
    second = await any_engine.engine.generate(prompt, sampling(max_tokens=6, seed=5))
    assert first.token_ids == second.token_ids


async def test_stop_string_ends_generation(any_engine: EngineUnderTest):
    # Greedy decoding is deterministic: generate once, then stop at a piece of its text.
    engine = any_engine.engine
    prompt = [10, 20, 30]
    full = await engine.generate(prompt, sampling(max_tokens=8, temperature=0))
    text = engine.tokenizer.decode(full.token_ids[:3])
    stop = text[-3:]
    stopped = await engine.generate(prompt, sampling(max_tokens=8, temperature=0, stop=(stop,)))
    assert stopped.finish_reason == "stop" and stopped.stop_text == stop
    assert stopped.token_ids == full.token_ids[: len(stopped.token_ids)]
    assert len(stopped.token_ids) <= 3


async def test_update_weights_bumps_the_version_and_changes_the_policy(
    any_engine: EngineUnderTest,
):
    engine = any_engine.engine
    prompt = [10, 20, 30]
    before = await engine.generate(prompt, sampling(max_tokens=4, temperature=0))
    version = engine.version
    original = any_engine.weights()
    name = "model.norm.weight"
    try:
        # A zero final norm makes every logit 0, so greedy picks token 0 each time.
        assert any_engine.load({name: torch.zeros_like(original[name])}) == version + 1
        after = await engine.generate(prompt, sampling(max_tokens=4, temperature=0))
        assert after.token_ids == [0] * 4 != before.token_ids
        assert after.policy_versions == [version + 1] * 4
    finally:
        any_engine.load({name: original[name]})


async def test_new_weights_give_the_logprobs_of_a_plain_forward(any_engine: EngineUnderTest):
    # Every weight changes, the tied embedding / LM head included: a copy of a weight the
    # engine keeps beside the parameter (vLLM's packed CPU kernels) must change with it.
    original = any_engine.weights()
    noise = torch.Generator().manual_seed(1)
    try:
        any_engine.load(
            {n: p + 0.2 * torch.randn(p.shape, generator=noise) for n, p in original.items()}
        )
        prompt = list(range(30, 45))
        completion = await any_engine.engine.generate(prompt, sampling(max_tokens=8, seed=2))
        expected = any_engine.forced_logprobs(prompt, completion.token_ids)
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4)
    finally:
        any_engine.load(original)


async def test_unknown_weight_names_and_wrong_shapes_are_refused(any_engine: EngineUnderTest):
    engine = any_engine.engine
    version = engine.version
    with pytest.raises(KeyError, match="no.such.weight"):
        engine.update_weights({"no.such.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="model.norm.weight"):
        engine.update_weights({"model.norm.weight": torch.zeros(3)})
    assert engine.version == version


def test_a_request_in_flight_across_an_update_keeps_exact_logprobs(any_engine: EngineUnderTest):
    # A stale KV cache would feed old-weight states to new-weight steps: the tokens after
    # the update would then match neither policy.
    engine = any_engine.engine
    old = any_engine.weights()
    noise = torch.Generator().manual_seed(0)
    new = {n: p + 0.05 * torch.randn(p.shape, generator=noise) for n, p in old.items()}
    prompt = list(range(5, 17))
    version = engine.version
    sampled: list[int] = []

    def slow_after_three(step: Sampled) -> None:
        """From the third token on, each step lasts a while, so the request cannot finish
        its 64 tokens before this thread pauses the engine, however the two are scheduled."""
        sampled.extend(step.token_ids)
        if len(sampled) >= 3:
            time.sleep(0.02)

    future = engine.submit(prompt, sampling(max_tokens=64, seed=7), slow_after_three)
    while len(sampled) < 3:
        time.sleep(0.001)
    try:
        with engine.paused():  # a weight update may be nested in a pause
            assert not future.done()
            assert any_engine.load(new) == version + 1
        completion = future.result(timeout=120)

        versions = completion.policy_versions
        old_tokens = versions.count(version)
        assert len(versions) == 64 and old_tokens >= 3
        assert versions == [version] * old_tokens + [version + 1] * (64 - old_tokens)
        expected = {version + 1: any_engine.forced_logprobs(prompt, completion.token_ids)}
        any_engine.load(old)
        expected[version] = any_engine.forced_logprobs(prompt, completion.token_ids)
        per_token = torch.stack([expected[v][i] for i, v in enumerate(versions)])
        assert torch.allclose(torch.tensor(completion.logprobs), per_token, atol=1e-4)
    finally:
        any_engine.load(old)


def test_paused_engine_decodes_nothing_until_resumed(any_engine: EngineUnderTest):
    engine = any_engine.engine
    with engine.paused():
        generated = engine.stats.generated_tokens
        future = engine.submit([10, 20, 30], sampling(max_tokens=4, seed=2))
        time.sleep(0.1)
        assert engine.stats.generated_tokens == generated and not future.done()
    assert len(future.result(timeout=60).token_ids) == 4


def test_identical_prompts_are_prefilled_once(tiny_engine):
    # Drive one prefill directly, so that all four requests are in it whatever the timing.
    from concurrent.futures import Future

    from reinforge.policy.batch import Batch
    from reinforge.policy.engine import _Request

    prompt = [11, 12, 13, 14]
    requests = [_Request(prompt, sampling(max_tokens=1, seed=s), Future()) for s in range(4)]
    requests.append(_Request([9, 8], sampling(max_tokens=1, seed=9), Future()))
    before = tiny_engine.stats.prefill_tokens
    with tiny_engine._lock, torch.inference_mode():
        tiny_engine._prefill(Batch(), requests)
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
    stats = tiny_engine.stats  # the model's time, split: both kinds of step were taken
    assert stats.prefill_s > 0 and stats.decode_s > 0
    assert stats.prefill_s + stats.decode_s <= stats.busy_s
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


def test_weight_update_bumps_the_version_once_and_times_itself(tiny_engine):
    version, sync_s = tiny_engine.version, tiny_engine.stats.sync_s
    with tiny_engine.weight_update() as new_version:
        assert tiny_engine.version == version  # the version changes with the weights
    assert new_version == tiny_engine.version == version + 1
    assert tiny_engine.stats.sync_s > sync_s
    with pytest.raises(RuntimeError), tiny_engine.weight_update():
        raise RuntimeError("optimizer step failed")
    assert tiny_engine.version == version + 1


@pytest.mark.parametrize("temperature", [0.0, 0.7])
async def test_top_logprobs_are_the_k_largest_of_the_sampling_distribution(
    any_engine: EngineUnderTest, temperature: float
):
    # The distribution a token is drawn from: the logits over the temperature (greedy: as
    # they are). A greedy token is the most likely, so its log-prob is its own first entry.
    prompt = list(range(100, 112))
    params = sampling(max_tokens=6, temperature=temperature, seed=4, top_logprobs=5)
    completion = await any_engine.engine.generate(prompt, params)
    ids = torch.tensor([prompt + completion.token_ids])
    with torch.no_grad():
        logits = any_engine.reference(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    expected = torch.log_softmax(logits / (temperature or 1.0), dim=-1)  # (T, V)
    assert len(completion.top_logprobs) == len(completion.token_ids)
    for k, (token, logprob, top) in enumerate(
        zip(completion.token_ids, completion.logprobs, completion.top_logprobs, strict=True)
    ):
        top_ids, top_values = (list(column) for column in zip(*top, strict=True))
        assert len(top) == 5 and top_values == sorted(top_values, reverse=True)
        largest = expected[k].topk(5).values
        # Near-ties may list either token: compare values, each under the reference.
        assert torch.allclose(torch.tensor(top_values), largest, atol=1e-4)
        assert torch.allclose(torch.tensor(top_values), expected[k, top_ids], atol=1e-4)
        if token in top_ids:
            assert logprob == top_values[top_ids.index(token)]
        if temperature == 0:
            assert top_ids[0] == token
    plain = await any_engine.engine.generate(prompt, sampling(max_tokens=2, seed=4))
    assert plain.top_logprobs == []  # nothing kept for a request that does not ask


async def test_a_listener_gets_every_token_before_the_completion(any_engine: EngineUnderTest):
    heard: list[Sampled] = []
    completion = await any_engine.engine.generate(
        [10, 20, 30], sampling(max_tokens=7, seed=1, top_logprobs=2), heard.append
    )
    assert [t for s in heard for t in s.token_ids] == completion.token_ids
    assert [lp for s in heard for lp in s.logprobs] == completion.logprobs
    assert [top for s in heard for top in s.top_logprobs] == completion.top_logprobs
    assert [v for s in heard for v in s.policy_versions] == completion.policy_versions


async def test_prompt_logprobs_are_those_of_a_plain_forward(any_engine: EngineUnderTest):
    # What a teacher gives: each token's log-prob given those before it, under the raw
    # model (no temperature), with its most likely alternatives.
    prompt = list(range(30, 52))
    scores = await any_engine.engine.prompt_logprobs(prompt, 3)
    expected = any_engine.forced_logprobs(prompt[:1], prompt[1:])
    torch.testing.assert_close(torch.tensor(scores.logprobs), expected, rtol=1e-4, atol=1e-5)
    assert len(scores.top_logprobs) == len(prompt) - 1
    for token, logprob, top in zip(prompt[1:], scores.logprobs, scores.top_logprobs, strict=True):
        values = [value for _, value in top]
        assert len(top) == 3 and values == sorted(values, reverse=True)
        assert values[0] >= logprob - 1e-5 * abs(logprob)
        if token in dict(top):
            assert dict(top)[token] == pytest.approx(logprob, rel=1e-5)
    assert (await any_engine.engine.prompt_logprobs(prompt, 0)).top_logprobs == []
