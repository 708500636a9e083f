"""The knob budget: the keys of the train tree are counted as a user sets them, and the
config reference's header states the count."""

from __future__ import annotations

from reinforge.config import Config
from reinforge.config_reference import leaf_keys, reference, train_keys


def test_leaf_keys_count_what_a_user_sets():
    keys = leaf_keys(Config)
    assert {"env.args", "env.max_turns", "run.steps", "distill.teachers.model"} <= keys
    # a variant's keys under its field, a key several variants hold once
    assert {"trainer.truncated.kind", "trainer.truncated.reward"} <= keys
    assert {"env", "trainer", "trainer.truncated", "env.args.difficulty"}.isdisjoint(keys)
    assert sum(key.startswith("trainer.algorithm.loss.correction.") for key in keys) == 5


def test_the_reference_states_the_count():
    assert f"the `reinforge train` tree has {train_keys()} keys" in reference()
