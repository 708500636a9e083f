import math

import pytest
import torch

from reinforge.train.advantages import dr_grpo_advantages, grpo_advantages


def test_grpo_uses_the_sample_std():
    # rewards [1, 0, 0, 1]: mean 0.5, deviations [+0.5, -0.5, -0.5, +0.5].
    # sample variance = 4 * 0.25 / (4 - 1) = 1/3, sample std = 0.57735 (TRL: torch.std).
    # advantage = 0.5 / (0.57735 + 1e-4) = 0.86588.
    # The population std (0.5) would give 0.5 / 0.5001 = 0.9998 instead.
    advantages = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert expected == pytest.approx(0.86588, abs=1e-5)
    assert advantages.tolist() == pytest.approx([expected, -expected, -expected, expected])


def test_grpo_on_an_uneven_group():
    # rewards [3, 1, 2]: mean 2, deviations [1, -1, 0];
    # sample variance = (1 + 1 + 0) / 2 = 1, std 1 -> advantages [1, -1, 0] / 1.0001.
    advantages = grpo_advantages(torch.tensor([3.0, 1.0, 2.0]))
    assert advantages.tolist() == pytest.approx([1 / 1.0001, -1 / 1.0001, 0.0])


def test_dr_grpo_only_centres():
    # rewards [1, 0, 0, 1]: mean 0.5 -> [0.5, -0.5, -0.5, 0.5], no division.
    advantages = dr_grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert advantages.tolist() == [0.5, -0.5, -0.5, 0.5]


def test_groups_without_a_signal_get_zero_advantages():
    # Equal rewards: deviations 0, std 0 -> 0 / (0 + eps) = 0.
    assert grpo_advantages(torch.tensor([1.0, 1.0, 1.0])).tolist() == [0.0, 0.0, 0.0]
    # One rollout: no sample std (torch.std would give NaN) and no sibling -> 0.
    assert grpo_advantages(torch.tensor([0.7])).tolist() == [0.0]


def test_each_row_is_its_own_group():
    # Row 0 as in test_grpo_uses_the_sample_std; row 1 is all 2s -> zeros.
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])  # (N=2, G=4)
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    advantages = grpo_advantages(rewards)  # (2, 4)
    assert advantages[0].tolist() == pytest.approx([expected, -expected, -expected, expected])
    assert advantages[1].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert dr_grpo_advantages(rewards)[1].tolist() == [0.0, 0.0, 0.0, 0.0]
