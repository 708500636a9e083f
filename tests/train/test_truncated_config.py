"""`trainer.truncated` as one typed variant: a kind alone as a string, the parametrised
`penalize` as a table, and the old `trainer.truncation_penalty` refused in one line naming
where it went."""

from __future__ import annotations

import pytest

from reinforge.config import Config, load_config
from reinforge.errors import ConfigError
from reinforge.train.algorithm import Keep, Mask, Penalize


@pytest.mark.parametrize(
    ("overrides", "variant"),
    [
        ([], Keep()),
        (["trainer.truncated=mask"], Mask()),
        (['trainer.truncated="keep"'], Keep()),
        (["trainer.truncated=penalize"], Penalize(reward=0.0)),
        (["trainer.truncated.kind=penalize", "trainer.truncated.reward=-1"], Penalize(reward=-1)),
        (['trainer.truncated={kind = "penalize", reward = -0.5}'], Penalize(reward=-0.5)),
    ],
)
def test_a_kind_alone_is_a_string_and_penalize_takes_its_reward(overrides, variant):
    assert load_config(Config, None, overrides).trainer.truncated == variant


def test_the_toml_table_form(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[trainer.truncated]\nkind = "penalize"\nreward = -1.0\n')
    assert load_config(Config, path, []).trainer.truncated == Penalize(reward=-1.0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer.truncation_penalty=-1"],
            "config trainer.truncation_penalty: moved to trainer.truncated.reward "
            '(with kind = "penalize")',
        ),
        (
            ["trainer.truncated=drop"],
            "config trainer.truncated.kind: 'drop' is none of 'keep', 'mask', 'penalize'",
        ),
        (
            ["trainer.truncated.reward=-1"],
            'config trainer.truncated.reward: a key of trainer.truncated.kind = "penalize", '
            'not of "keep"',
        ),
    ],
)
def test_a_bad_or_old_key_is_one_line(overrides, message):
    with pytest.raises(ConfigError) as raised:
        load_config(Config, None, overrides)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)
