import math

import pytest
import torch

from reinforge.policy.sampling import RowSampler, SamplingParams, sample


def sampling(**settings: object) -> SamplingParams:
    """Plain sampling (temperature 1, top_p 1) with the given settings changed."""
    return SamplingParams(
        **{"max_tokens": 1, "temperature": 1.0, "top_p": 1.0, "stop_loops": False, **settings}
    )  # type: ignore[arg-type]


def rows(*params: SamplingParams) -> list[RowSampler]:
    return [RowSampler(p) for p in params]


def test_logprob_at_temperature_one_is_the_models_log_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    tokens, logprobs, _ = sample(logits, rows(sampling(seed=3)))
    expected = torch.log_softmax(logits, dim=-1)[0, tokens[0]]
    assert torch.allclose(logprobs[0], expected)


def test_nucleus_renormalises_over_the_kept_tokens():
    # probs = [0.5, 0.3, 0.2]; top_p 0.7 keeps tokens 0 and 1 (mass before token 1 is
    # 0.5 < 0.7, before token 2 is 0.8 >= 0.7), renormalised to [0.625, 0.375].
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    seen = set()
    for seed in range(40):
        token, logprob, _ = sample(logits, rows(sampling(top_p=0.7, seed=seed)))
        seen.add(int(token))
        expected = {0: math.log(0.625), 1: math.log(0.375)}[int(token)]
        assert math.isclose(float(logprob), expected, rel_tol=1e-5)
    assert seen == {0, 1}


def test_temperature_scales_the_reported_distribution():
    # At T=2 the logits [2, 0] become [1, 0]: p = e/(e+1) for token 0.
    logits = torch.tensor([[2.0, 0.0]])
    token, logprob, _ = sample(logits, rows(sampling(temperature=2.0, seed=1)))
    p0 = math.e / (math.e + 1)
    expected = math.log(p0) if int(token) == 0 else math.log(1 - p0)
    assert math.isclose(float(logprob), expected, rel_tol=1e-5)


def test_greedy_takes_the_argmax():
    logits = torch.tensor([[0.1, 3.0, 0.2], [5.0, 0.0, 0.0]])
    tokens, _, _ = sample(logits, rows(sampling(temperature=0), sampling(temperature=0)))
    assert tokens.tolist() == [1, 0]


def test_a_seeded_row_is_reproducible_whatever_shares_its_batch():
    logits = torch.randn(3, 1000)
    alone, _, _ = sample(logits[:1], rows(sampling(seed=7)))
    batched, _, _ = sample(logits, rows(sampling(seed=7), sampling(), sampling()))
    assert int(alone[0]) == int(batched[0])


def test_draws_follow_the_distribution():
    # 2000 draws from p = [0.7, 0.2, 0.1]; each frequency within 0.04 of p.
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    sampler = rows(sampling(seed=0))
    counts = [0, 0, 0]
    for _ in range(2000):
        counts[int(sample(logits, sampler)[0][0])] += 1
    for count, p in zip(counts, [0.7, 0.2, 0.1], strict=True):
        assert abs(count / 2000 - p) < 0.04


def test_top_logprobs_come_from_the_distribution_the_token_was_drawn_from():
    # probs = [0.5, 0.3, 0.2] at top_p 0.7: the nucleus {0, 1} renormalised to
    # [0.625, 0.375]; token 2 is outside it (-inf). The second row asks for none.
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]]))
    asking = sampling(top_p=0.7, top_logprobs=3, seed=1)
    tokens, logprobs, top = sample(logits, rows(asking, sampling(seed=2)))
    assert top[1] is None
    ids, values = zip(*top[0], strict=True)
    assert ids == (0, 1, 2)
    assert math.isclose(values[0], math.log(0.625), rel_tol=1e-5)
    assert math.isclose(values[1], math.log(0.375), rel_tol=1e-5)
    assert values[2] == float("-inf")
    assert float(logprobs[0]) == values[ids.index(int(tokens[0]))]


def _reference_draw(logits: torch.Tensor, params: list[SamplingParams]) -> tuple[list, list]:
    """The draw written out plainly, one row at a time: scale by the temperature, restrict
    to the nucleus, invert the float64 CDF at the row's uniform; argmax when greedy. (When
    any row has a nucleus, every row is renormalised: a no-op up to rounding at top_p 1.)"""
    tokens, logprobs = [], []
    any_nucleus = any(p.top_p < 1 for p in params)
    for row, p in zip(logits.float(), params, strict=True):
        generator = RowSampler(p).generator
        scaled = row / (1.0 if p.temperature <= 0 else torch.tensor(p.temperature))
        logp = torch.log_softmax(scaled, dim=-1)
        if any_nucleus:
            ordered, order = torch.sort(logp, descending=True)
            before = torch.cumsum(ordered.exp(), dim=-1) - ordered.exp()
            drop = torch.zeros_like(before, dtype=torch.bool)
            drop[order] = before >= p.top_p
            logp = logp.masked_fill(drop, float("-inf"))
            logp = logp - torch.logsumexp(logp, dim=-1)
        cdf = logp.double().exp().cumsum(dim=-1)
        uniform = torch.rand(1, generator=generator, dtype=torch.float64)
        token = int(torch.searchsorted(cdf, uniform * cdf[-1], right=True).clamp(max=len(row) - 1))
        if p.temperature <= 0:
            token = int(torch.argmax(row))
        tokens.append(token)
        logprobs.append(float(logp[token]))
    return tokens, logprobs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "settings",
    [
        [{}],  # temperature 1 only: no division
        [{}, {"temperature": 0}],  # greedy beside sampled: the argmax is taken
        [{"temperature": 0.7}, {}, {"temperature": 0}, {"top_p": 0.9}, {"temperature": 1.3}],
    ],
)
def test_a_batch_draws_what_the_plain_inverse_cdf_draws(dtype, settings):
    # Bit for bit: the tokens a seed draws must not move when the batched draw is changed.
    torch.manual_seed(0)
    logits = (torch.randn(12, 5000) * 3).to(dtype)
    params = [sampling(seed=row, **settings[row % len(settings)]) for row in range(12)]
    tokens, logprobs, _ = sample(logits, rows(*params))
    expected_tokens, expected_logprobs = _reference_draw(logits, params)
    assert tokens.tolist() == expected_tokens
    assert logprobs.tolist() == expected_logprobs
