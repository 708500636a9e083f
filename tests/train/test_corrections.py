"""Off-policy corrections of the PPO loss: truncated (TIS) and masked (MIS) importance
sampling against the trainer's proximal policy, and "none", today's behaviour anchor."""

import math

import pytest
import torch

from reinforge.config import Config, load_config
from reinforge.errors import ConfigError
from reinforge.train.algorithm import PPOClipLoss
from reinforge.train.losses import (
    kl_k3,
    masked_importance_weights,
    masked_mean,
    token_mean_weights,
    truncated_importance_weights,
)
from reinforge.train.token_weights import MaskedIS, NoCorrection, TruncatedIS

INF = float("inf")


def _logp(ratios: list[list[float]]) -> torch.Tensor:
    """Log-probs whose ratio to an all-zero behaviour is `ratios`: log r, exactly 0 for r 1."""
    return torch.tensor(ratios).log()  # (B, T)


# ---- weights ----


def test_truncated_importance_weights():
    # r = pi_prox / pi_behaviour = [0.5, 1.5, 3.0] on three tokens, then padding holding
    # +inf (prox) and -inf (behaviour): exp(inf - -inf) would be inf there.
    # cap 2: w = min(r, 2) = [0.5, 1.5, 2.0], 0 at padding; only the third is truncated.
    prox = torch.cat([_logp([[0.5, 1.5, 3.0]]), torch.tensor([[INF]])], dim=-1)  # (1, 4)
    behaviour = torch.tensor([[0.0, 0.0, 0.0, -INF]])  # (1, 4)
    mask = torch.tensor([[1, 1, 1, 0]])  # (1, 4)
    weights, truncated = truncated_importance_weights(prox, behaviour, mask, cap=2.0)
    assert weights[0].tolist() == pytest.approx([0.5, 1.5, 2.0, 0.0])
    assert truncated[0].tolist() == [False, False, True, False]
    assert masked_mean(truncated.float(), mask).item() == pytest.approx(1 / 3)


# Rows of ratios pi_prox / pi_behaviour, 1.0 at padding where log-probs are garbage:
#   row 0: [4, 1, 1]      geometric mean 4^(1/3) = 1.587, inside [0.5, 2]
#   row 1: [0.25, 0.8, .] geometric mean sqrt(0.2) = 0.447, below 0.5
#   row 2: [4, 1.5, .]    geometric mean sqrt(6) = 2.449, above 2
#   row 3: no token
MIS_RATIOS = [[4.0, 1.0, 1.0], [0.25, 0.8, 1.0], [4.0, 1.5, 1.0], [1.0, 1.0, 1.0]]
MIS_MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [0, 0, 0]])  # (4, 3)
MIS_PROX = torch.where(MIS_MASK.bool(), _logp(MIS_RATIOS), INF)  # (4, 3)
MIS_BEHAVIOUR = torch.where(MIS_MASK.bool(), 0.0, -INF)  # (4, 3)


def test_masked_importance_weights_by_token():
    # [low, high] = [0.5, 2]: each token by its own ratio. Dropped: 4 (row 0), 0.25 (row 1),
    # 4 (row 2): 3 of 7 tokens. Kept tokens weigh their ratio.
    weights, dropped = masked_importance_weights(MIS_PROX, MIS_BEHAVIOUR, MIS_MASK, 0.5, 2.0)
    assert weights.tolist() == [
        pytest.approx([0.0, 1.0, 1.0]),
        pytest.approx([0.0, 0.8, 0.0]),
        pytest.approx([0.0, 1.5, 0.0]),
        [0.0, 0.0, 0.0],
    ]
    assert dropped.tolist() == [
        [True, False, False],
        [True, False, False],
        [True, False, False],
        [False, False, False],
    ]
    assert masked_mean(dropped.float(), MIS_MASK).item() == pytest.approx(3 / 7)


def test_masked_importance_weights_by_sequence():
    # By geometric mean: row 0 (ratios 4, 1, 1) is kept whole, every token weighing
    # (4 * 1 * 1) ** (1/3) = 1.5874, inside [0.5, 2] though its first ratio is not; rows 1
    # and 2 are dropped whole, though 0.8 and 1.5 alone would stay. Dropped: 2 + 2 of 7.
    weights, dropped = masked_importance_weights(
        MIS_PROX, MIS_BEHAVIOUR, MIS_MASK, 0.5, 2.0, level="sequence"
    )
    assert weights.tolist() == [
        pytest.approx([4 ** (1 / 3)] * 3),
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
    ]
    assert dropped.tolist() == [
        [False, False, False],
        [True, True, False],
        [True, True, False],
        [False, False, False],
    ]
    assert masked_mean(dropped.float(), MIS_MASK).item() == pytest.approx(4 / 7)


# ---- in the loss ----


def test_tis_gradient_is_the_capped_weight_times_the_advantage():
    # r = pi / pi_behaviour = [0.5, 1.5, 3.0], A = [1, -2, 1], cap 2, then one padding
    # token holding +inf / -inf. The PPO ratio is against logp.detach(): 1 in value, never
    # clipped. Per token, loss = -min(r, 2) A = [-0.5, 3, -2]; token mean over 3:
    #   loss = (-0.5 + 3 - 2) / 3 = 0.16667
    #   d loss / d logp = -min(r, 2) A / 3 = [-0.16667, 1, -0.66667], 0 at padding.
    # Against the behaviour policy the third token (r = 3 > 1.28, A > 0) would be clipped,
    # with no gradient; max_ratio would leave it none either.
    logp = torch.cat([_logp([[0.5, 1.5, 3.0]]), torch.tensor([[INF]])], -1).requires_grad_()
    behaviour = torch.tensor([[0.0, 0.0, 0.0, -INF]])  # (1, 4)
    advantages = torch.tensor([[1.0, -2.0, 1.0, 1.0]])  # (1, 4)
    mask = torch.tensor([[1, 1, 1, 0]])  # (1, 4)
    loss, metrics = PPOClipLoss(correction=TruncatedIS(cap=2.0)).compute(
        logp, behaviour, advantages, mask
    )
    assert loss.item() == pytest.approx(0.5 / 3)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([-0.5 / 3, 1.0, -2 / 3, 0.0])
    # mismatch_kl: r - 1 - ln r = 0.19315, 0.09453, 0.90139; mean 0.39636.
    assert metrics.scalars() == pytest.approx(
        {
            "ratio": (0.5 + 1.5 + 3.0) / 3,  # pi / pi_behaviour, not the anchor's 1
            "clip_fraction": 0.0,
            "clip_low_fraction": 0.0,
            "clip_high_fraction": 0.0,
            "capped_fraction": 0.0,
            "mismatch_kl": 0.39636,
            "corrected_fraction": 1 / 3,
        },
        abs=1e-5,
    )


def test_a_later_update_is_clipped_around_the_first_passs_proximal_policy():
    # The batch's second update: the proximal log-probs are those of its first pass, not
    # this forward's. Behaviour and proximal agree (v = 1); the policy has since moved to
    # r = pi / pi_prox = [1.5, 0.9, 0.5], A = [1, 1, -1]. Clip [0.8, 1.28]:
    #   token 1: A > 0, r 1.5 > 1.28 -> clipped, constant -1.28, no gradient
    #   token 2: inside, loss -0.9, gradient -r A / 3 = -0.3
    #   token 3: A < 0, r 0.5 < 0.8 -> clipped, constant 0.8, no gradient
    # token mean: (-1.28 - 0.9 + 0.8) / 3 = -0.46
    logp = _logp([[1.5, 0.9, 0.5]]).requires_grad_()  # (1, 3)
    zeros = torch.zeros(1, 3)
    mask = torch.ones(1, 3)
    loss, metrics = PPOClipLoss(correction=TruncatedIS(cap=2.0)).compute(
        logp, zeros, torch.tensor([[1.0, 1.0, -1.0]]), mask, proximal_logp=zeros
    )
    assert loss.item() == pytest.approx(-0.46)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.3, 0.0])
    assert metrics.clip_high_fraction.item() == pytest.approx(1 / 3)
    assert metrics.clip_low_fraction.item() == pytest.approx(1 / 3)
    # Without the proximal log-probs this forward is the anchor: r = 1, nothing clipped.
    _, first = PPOClipLoss(correction=TruncatedIS(cap=2.0)).compute(
        logp, zeros, torch.tensor([[1.0, 1.0, -1.0]]), mask
    )
    assert first.clip_fraction.item() == 0.0


def test_mis_leaves_dropped_tokens_out_of_the_loss_but_not_the_normaliser():
    # r = [0.25, 1.6], A = [1, 1], [low, high] = [0.5, 2]: the first token is dropped
    # (weight 0, no gradient), the second weighs 1.6. Token mean still divides by the 2
    # tokens of the loss mask, so the weights stay a function of the mask alone:
    #   loss = (0 - 1.6) / 2 = -0.8, d loss / d logp = [0, -0.8].
    logp = _logp([[0.25, 1.6]]).requires_grad_()  # (1, 2)
    loss, metrics = PPOClipLoss(correction=MaskedIS()).compute(
        logp, torch.zeros(1, 2), torch.ones(1, 1), torch.ones(1, 2)
    )
    assert loss.item() == pytest.approx(-0.8)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.8])
    assert metrics.corrected_fraction.item() == pytest.approx(0.5)


def _behaviour_anchored_loss(logp, behaviour, advantages, mask, ref, eps_low, eps_high, cap):
    """The PPO clip loss as it was before corrections, written out: the reference for "none"."""
    mask = mask.bool()
    ratio = torch.exp(torch.where(mask, logp - behaviour, 0.0))
    weight = ratio.clamp(max=cap)
    unclipped = weight * advantages
    clipped = weight.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    per_token = torch.where(mask, -torch.minimum(unclipped, clipped), 0.0)
    per_token = per_token + 0.1 * kl_k3(logp, ref, mask)
    return (per_token * token_mean_weights(mask)).sum()


def test_no_correction_is_the_behaviour_anchored_loss_bit_for_bit():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 1, 0, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    logp = torch.where(mask.bool(), -torch.rand(3, 6) * 3, INF)  # (3, 6)
    behaviour = torch.where(mask.bool(), logp + torch.randn(3, 6) * 0.4, -INF)  # (3, 6)
    ref = torch.where(mask.bool(), logp - 0.1, INF)  # (3, 6)
    advantages = torch.tensor([[1.0], [-2.0], [0.5]])  # (3, 1)
    config = PPOClipLoss(eps_low=0.2, eps_high=0.28, max_ratio=1.5, kl_coef=0.1)
    assert config.correction == NoCorrection()

    new = logp.clone().requires_grad_()
    loss, metrics = config.compute(new, behaviour, advantages, mask, ref_logp=ref)
    loss.backward()
    old = logp.clone().requires_grad_()
    expected = _behaviour_anchored_loss(old, behaviour, advantages, mask, ref, 0.2, 0.28, 1.5)
    expected.backward()

    assert torch.equal(loss, expected)
    assert new.grad is not None and old.grad is not None
    assert torch.equal(new.grad, old.grad)
    assert 0.0 < metrics.clip_fraction.item() < 1.0  # the data exercises the clip
    assert metrics.corrected_fraction.item() == 0.0


@pytest.mark.parametrize(
    "correction",
    [NoCorrection(), TruncatedIS(), MaskedIS(), MaskedIS(level="sequence")],
    ids=str,
)
def test_padding_gets_zero_loss_and_zero_gradient(correction):
    torch.manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 0, 1, 0], [0, 0, 0, 0, 0]])  # (3, 5)
    logp = torch.where(mask.bool(), -torch.rand(3, 5), INF).requires_grad_()  # (3, 5)
    behaviour = torch.where(mask.bool(), logp.detach() - 0.1, -INF)  # (3, 5), r = 1.105
    advantages = torch.tensor([[1.0], [-2.0], [0.5]])  # (3, 1)
    loss, metrics = PPOClipLoss(correction=correction).compute(logp, behaviour, advantages, mask)
    loss.backward()
    assert torch.isfinite(loss)
    assert logp.grad is not None
    assert logp.grad[mask == 0].eq(0).all()
    assert logp.grad[mask == 1].ne(0).all()
    assert all(math.isfinite(value) for value in metrics.scalars().values())


# ---- config ----

CORRECTION = "trainer.algorithm.loss.correction."


def test_the_correction_is_chosen_in_the_config():
    def correction(*overrides: str):
        return load_config(Config, None, list(overrides)).trainer.algorithm.loss.correction

    assert correction() == NoCorrection()
    assert correction(CORRECTION + "kind=tis") == TruncatedIS(cap=2.0)
    assert correction(CORRECTION + "kind=tis", CORRECTION + "cap=5") == TruncatedIS(cap=5.0)
    assert correction(
        CORRECTION + "kind=mis", CORRECTION + "low=0.2", CORRECTION + "level=sequence"
    ) == MaskedIS(low=0.2, high=2.0, level="sequence")


@pytest.mark.parametrize(
    ("overrides", "key", "problem"),
    [
        (["kind=tis", "cap=0.5"], "correction.cap", "greater than or equal to 1"),
        (["kind=mis", "low=3"], "correction.low", "less than 1"),  # low above high
        (["kind=mis", "high=0.4"], "correction.high", "greater than 1"),  # high below low
        (["kind=mis", "level=sentence"], "correction.level", "'token' or 'sequence'"),
        (["cap=3"], "correction.cap", 'kind = "tis", not of "none"'),  # a cap without kind=tis
        (["kind=is"], "correction.kind", "'is' is none of 'none', 'tis', 'mis'"),
    ],
)
def test_bad_corrections_are_rejected(overrides, key, problem):
    with pytest.raises(ConfigError) as caught:
        load_config(Config, None, [CORRECTION + override for override in overrides])
    assert caught.value.key.endswith(key)
    assert problem in caught.value.problem
