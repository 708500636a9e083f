import math

import pytest
import torch
from pydantic import ValidationError

from reinforge.train.algorithm import AlgorithmConfig, DrGRPOAdvantage, PPOClipLoss
from reinforge.train.losses import (
    cross_entropy,
    kl_k3,
    ppo_clip_loss,
    token_entropy,
    token_logprobs,
)
from reinforge.train.token_weights import ConstantNorm, SequenceMean, TokenMean

# ---- aggregation ----

# Row 0 has 3 tokens, row 1 has 1 (the 99s are padding), row 2 has none.
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [10.0, 99.0, 99.0], [5.0, 5.0, 5.0]])  # (3, 3)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # (3, 3)
LOSS = torch.where(MASK.bool(), PER_TOKEN, 0.0)  # losses are 0 where the mask is 0


def test_token_and_sequence_mean_differ_on_a_ragged_mask():
    # token mean: (1 + 2 + 3 + 10) / 4 tokens = 4.
    assert TokenMean().aggregate(LOSS, MASK).item() == pytest.approx(4.0)
    # sequence mean: row 0 -> 6 / 3 = 2, row 1 -> 10 / 1 = 10; the empty row is left out:
    # (2 + 10) / 2 = 6. The short sequence's one token weighs 1/2, each long one's 1/6.
    assert SequenceMean().aggregate(LOSS, MASK).item() == pytest.approx(6.0)
    # constant norm, max_tokens 4: 16 / (B * 4) = 16 / 12 = 1.3333 (B counts the empty row).
    assert ConstantNorm(max_tokens=4).aggregate(LOSS, MASK).item() == pytest.approx(16 / 12)


def test_whole_batch_weights_sliced_by_rows_aggregate_micro_batches_exactly():
    # Token mean over micro-batches {row 0}, {rows 1, 2}: 6/4 + 10/4 = 4, as for the batch;
    # averaging the two micro-batch means would give (2 + 10) / 2 = 6 instead.
    for aggregation in (TokenMean(), SequenceMean(), ConstantNorm(max_tokens=4)):
        weights = aggregation.weights(MASK)  # (3, 3)
        parts = (LOSS[:1] * weights[:1]).sum() + (LOSS[1:] * weights[1:]).sum()
        assert parts.item() == pytest.approx(aggregation.aggregate(LOSS, MASK).item())


def test_an_all_zero_mask_gives_zero_not_nan():
    per_token = torch.ones(2, 3, requires_grad=True)  # (2, 3)
    mask = torch.zeros(2, 3)  # (2, 3)
    for aggregation in (TokenMean(), SequenceMean(), ConstantNorm(max_tokens=4)):
        loss = aggregation.aggregate(per_token, mask)
        loss.backward()
        assert loss.item() == 0.0
        assert per_token.grad is not None and per_token.grad.eq(0).all()


# ---- PPO clip ----

# One row, four sampled tokens and one padding token. The behaviour policy gave every sampled
# token log-prob -1; the trainer's ratios are r = [1.5, 0.5, 0.5, 1.5]. At padding the
# behaviour log-prob is garbage (-1e9), which must not matter.
RATIOS = torch.tensor([[1.5, 0.5, 0.5, 1.5, 1.0]])  # (1, 5)
BEHAVIOUR = torch.tensor([[-1.0, -1.0, -1.0, -1.0, -1e9]])  # (1, 5)
ADVANTAGES = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0]])  # (1, 5)
PPO_MASK = torch.tensor([[1, 1, 1, 1, 0]])  # (1, 5)


def _logp() -> torch.Tensor:
    return (-1.0 + RATIOS.log()).requires_grad_()  # (1, 5)


def test_ppo_clip_on_both_sides_for_both_signs():
    # eps_low 0.2, eps_high 0.28: clip range [0.8, 1.28]. loss = -min(r A, clip(r) A).
    #   A=+1, r=1.5: min(1.5, 1.28)   = 1.28  -> -1.28, clipped high (no gradient)
    #   A=+1, r=0.5: min(0.5, 0.8)    = 0.5   -> -0.5,  unclipped
    #   A=-1, r=0.5: min(-0.5, -0.8)  = -0.8  ->  0.8,  clipped low (no gradient)
    #   A=-1, r=1.5: min(-1.5, -1.28) = -1.5  ->  1.5,  unclipped
    #   padding                                ->  0
    logp = _logp()
    per_token, metrics = ppo_clip_loss(
        logp, BEHAVIOUR, ADVANTAGES, PPO_MASK, eps_low=0.2, eps_high=0.28
    )
    assert per_token[0].tolist() == pytest.approx([-1.28, -0.5, 0.8, 1.5, 0.0])
    # Clipped on 2 of 4 sampled tokens, one on each side; mean ratio (1.5+.5+.5+1.5)/4 = 1.
    assert metrics.clip_fraction.item() == pytest.approx(0.5)
    assert metrics.clip_low_fraction.item() == pytest.approx(0.25)
    assert metrics.clip_high_fraction.item() == pytest.approx(0.25)
    assert metrics.mean_ratio.item() == pytest.approx(1.0)
    assert metrics.capped_fraction.item() == 0.0
    # d loss / d logp = -A r where unclipped: token 1 -> -0.5, token 3 -> +1.5; else 0.
    per_token.sum().backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.5, 0.0, 1.5, 0.0])


def test_ppo_gradient_is_exactly_zero_at_masked_positions():
    torch.manual_seed(0)
    logp = (-torch.rand(3, 6) * 3).requires_grad_()  # (3, 6)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 1, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0]])
    # Garbage at padding: exp(logp - behaviour) and exp(ref - logp) would overflow there.
    behaviour = torch.where(mask.bool(), -torch.rand(3, 6), -1e9)  # (3, 6)
    ref = torch.where(mask.bool(), logp.detach() - 0.1, 1e9)  # (3, 6)
    advantages = torch.tensor([[1.0], [-2.0], [0.5]])  # (3, 1)
    loss, _ = PPOClipLoss(kl_coef=0.1).compute(logp, behaviour, advantages, mask, ref_logp=ref)
    loss.backward()
    assert torch.isfinite(loss)
    assert logp.grad is not None
    assert logp.grad[mask == 0].eq(0).all()
    assert logp.grad[mask == 1].ne(0).all()


def test_max_ratio_caps_the_weight_before_the_min():
    # max_ratio 1.3, clip range [0.8, 1.28]; ratios [1.5, 1.5, 1.1], A [-1, +1, -1].
    #   A=-1, r=1.5: w=1.3, min(-1.3, -1.28) = -1.3 -> 1.3 (was 1.5), no gradient: dual clip
    #   A=+1, r=1.5: w=1.3, min(1.3, 1.28)   = 1.28 -> -1.28, unchanged (already clipped)
    #   A=-1, r=1.1: under the cap, min(-1.1, -1.1) -> 1.1, gradient -A r = 1.1
    logp = torch.tensor([[1.5, 1.5, 1.1]]).log().requires_grad_()  # (1, 3)
    behaviour = torch.zeros(1, 3)  # (1, 3)
    advantages = torch.tensor([[-1.0, 1.0, -1.0]])  # (1, 3)
    mask = torch.ones(1, 3)  # (1, 3)
    per_token, metrics = ppo_clip_loss(
        logp, behaviour, advantages, mask, eps_low=0.2, eps_high=0.28, max_ratio=1.3
    )
    assert per_token[0].tolist() == pytest.approx([1.3, -1.28, 1.1])
    assert metrics.capped_fraction.item() == pytest.approx(2 / 3)
    assert metrics.mean_ratio.item() == pytest.approx((1.5 + 1.5 + 1.1) / 3)  # before the cap
    per_token.sum().backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0, 1.1])


def test_advantages_must_be_two_dimensional():
    # A (B,) tensor would broadcast along T when B == T: refuse it rather than guess.
    with pytest.raises(ValueError, match=r"\(B, 1\)"):
        ppo_clip_loss(
            torch.zeros(2, 2),
            torch.zeros(2, 2),
            torch.ones(2),
            torch.ones(2, 2),
            eps_low=0.2,
            eps_high=0.2,
        )


# ---- KL, entropy, cross-entropy ----


def test_kl_k3():
    # d = ref - logp. d = 0 -> e^0 - 0 - 1 = 0.
    # d = ln 0.5 = -0.69315 -> 0.5 + 0.69315 - 1 = 0.19315.
    # d = ln 2 = +0.69315   -> 2 - 0.69315 - 1 = 0.30685. Padding (d = 1000) -> 0.
    logp = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])  # (1, 4)
    ref = logp + torch.tensor([[0.0, math.log(0.5), math.log(2.0), 1000.0]])  # (1, 4)
    kl = kl_k3(logp, ref, torch.tensor([[1, 1, 1, 0]]))
    assert kl[0].tolist() == pytest.approx([0.0, 0.19315, 0.30685, 0.0], abs=1e-5)


def test_kl_penalty_in_the_loss():
    # One token, r = 1, A = 0: PPO term 0. ref - logp = ln 2 -> k3 = 0.30685.
    # loss = 0.1 * 0.30685 = 0.030685 (token mean over one token).
    config = PPOClipLoss(kl_coef=0.1)
    assert config.needs_reference and not PPOClipLoss().needs_reference
    logp = torch.tensor([[-1.0]])  # (1, 1)
    loss, metrics = config.compute(
        logp, logp, torch.zeros(1, 1), torch.ones(1, 1), ref_logp=logp + math.log(2.0)
    )
    assert loss.item() == pytest.approx(0.030685, abs=1e-6)
    assert metrics.kl is not None and metrics.kl.item() == pytest.approx(0.30685, abs=1e-5)
    with pytest.raises(ValueError, match="reference"):
        config.compute(logp, logp, torch.zeros(1, 1), torch.ones(1, 1))


def test_token_entropy():
    # uniform over 4 -> ln 4 = 1.38629. p = [0.25, 0.75] (logits [0, ln 3]) ->
    # -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.34657 + 0.21576 = 0.56233. One-hot via -inf -> 0.
    inf = float("inf")
    logits = torch.tensor(
        [[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -inf, -inf], [0.0, -inf, -inf, -inf]]
    )  # (N=3, V=4)
    logits.requires_grad_()
    entropy = token_entropy(logits)  # (3,)
    assert entropy.tolist() == pytest.approx([1.38629, 0.56233, 0.0], abs=1e-5)
    entropy.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_cross_entropy():
    # Position 0: logits [0, 0], target 1 -> -ln 0.5 = 0.69315.
    # Position 1: logits [0, ln 3], target 1 -> -ln 0.75 = 0.28768. Position 2: padding, -100.
    # Token mean: (0.69315 + 0.28768) / 2 = 0.49041.
    logits = torch.tensor([[[0.0, 0.0], [0.0, math.log(3.0)], [5.0, 0.0]]])  # (1, 3, 2)
    targets = torch.tensor([[1, 1, -100]])  # (1, 3)
    mask = torch.tensor([[1, 1, 0]])  # (1, 3)
    nll = cross_entropy(logits, targets, mask)  # (1, 3)
    assert nll[0].tolist() == pytest.approx([0.69315, 0.28768, 0.0], abs=1e-5)
    assert TokenMean().aggregate(nll, mask).item() == pytest.approx(0.49041, abs=1e-5)
    assert token_logprobs(logits[0, :2], targets[0, :2]).tolist() == pytest.approx(
        [-0.69315, -0.28768], abs=1e-5
    )


# ---- config ----


def test_config_round_trips_from_a_dict():
    raw = {
        "advantage": {"kind": "dr_grpo"},
        "loss": {
            "kind": "ppo_clip",
            "eps_high": 0.3,
            "max_ratio": 2.0,
            "kl_coef": 0.05,
            "aggregation": {"kind": "constant_norm", "max_tokens": 512},
        },
    }
    config = AlgorithmConfig.model_validate(raw)
    assert isinstance(config.advantage, DrGRPOAdvantage)
    assert config.loss.aggregation == ConstantNorm(max_tokens=512)
    assert AlgorithmConfig.model_validate(config.model_dump()) == config


def test_config_defaults_need_no_kind():
    # Overrides name only what they change: GRPO advantages and token-mean PPO clip.
    config = AlgorithmConfig.model_validate({"loss": {"kl_coef": 0.1}})
    assert config.advantage.kind == "grpo"
    assert config.loss.kl_coef == 0.1 and isinstance(config.loss.aggregation, TokenMean)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ({"loss": {"epsilon": 0.2}}, "extra_forbidden"),
        ({"advantage": {"kind": "grpo", "scale": True}}, "extra_forbidden"),
        ({"loss": {"kind": "cispo"}}, "union_tag_invalid"),
        ({"advantage": {"kind": "rloo"}}, "union_tag_invalid"),
        ({"loss": {"aggregation": {"kind": "sum"}}}, "union_tag_invalid"),
    ],
)
def test_config_rejects_unknown_keys_and_kinds(raw, error):
    with pytest.raises(ValidationError) as caught:
        AlgorithmConfig.model_validate(raw)
    assert caught.value.errors()[0]["type"] == error
