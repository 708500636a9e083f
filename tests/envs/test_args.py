"""A loader's declared arguments: `env.args` validated into its `Args` before it runs, so a
bad argument is one line naming its key; a loader that declares none gets plain keywords;
and the per-turn limits are `env` keys of every environment, never a loader's."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from reinforge.envs import load_environment
from reinforge.envs.builtin import arithmetic, wordle
from reinforge.envs.config import EnvConfig
from reinforge.envs.registry import declared_args, load_configured
from reinforge.errors import ConfigError, UsageError

from ..commands import LENGTH_ENV, reinforge_here

DECLARED = """\
from pydantic import Field

from reinforge.envs import Environment, Harness, Rubric
from reinforge.types import Section


class Args(Section):
    size: int = Field(3, ge=1)
    label: str = "plain"


class Sized(Environment):
    name = "sized"

    def __init__(self, args: Args) -> None:
        super().__init__(Harness(), Rubric())
        self.args = args

    def tasks(self, n, seed=0):
        return []


def load_environment(args: Args) -> Sized:
    return Sized(args)
"""


@pytest.fixture
def declared(tmp_path: Path) -> str:
    path = tmp_path / "declared_env.py"
    path.write_text(DECLARED)
    return str(path)


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("arithmetic", {"dificulty": 2}, "config env.args.dificulty: unknown key"),
        (
            "arithmetic",
            {"difficulty": 7},
            "config env.args.difficulty: Input should be less than or equal to 4",
        ),
        ("tictactoe", {"opponent": "perfect"}, "config env.args.opponent: Input should be"),
        ("wordle", {"max_guesses": "six"}, "config env.args.max_guesses: Input should be a"),
        ("calculator", {"tool_weight": [1]}, "config env.args.tool_weight: Input should be"),
        ("coding", {"tiers": "easy"}, "config env.args.tiers: Input should be a valid list"),
    ],
)
def test_a_bad_argument_of_a_declared_loader_is_one_line_naming_its_key(name, args, message):
    with pytest.raises(ConfigError) as raised:
        load_environment(name, **args)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


@pytest.mark.parametrize("name", ["arithmetic", "calculator", "coding"])
@pytest.mark.parametrize("limit", ["max_turns", "max_tokens_per_turn"])
def test_a_per_turn_limit_among_the_args_names_the_env_key(name, limit):
    with pytest.raises(ConfigError, match=f"^config env.args.{limit}: moved to env.{limit}$"):
        load_environment(name, **{limit: 3})


def test_the_loader_gets_its_args_model_with_the_defaults_of_its_fields(declared, monkeypatch):
    assert declared_args(arithmetic.load_environment) == ("args", arithmetic.Args)
    env = load_environment(declared, size="4")  # lax: a TOML string of digits is an int
    assert env.args.model_dump() == {"size": 4, "label": "plain"}
    with pytest.raises(ConfigError, match="^config env.args.size: Input should be greater"):
        load_environment(declared, size=0)
    with pytest.raises(ConfigError, match="^config env.args.colour: unknown key$"):
        load_environment(declared, colour="red")
    monkeypatch.syspath_prepend(str(Path(declared).parent))
    env = load_environment("declared_env:load_environment", size=2)
    assert env.args.size == 2  # module:function declares it the same way


def test_a_loader_without_args_gets_plain_keywords_and_its_signature_checks_them(tmp_path):
    assert declared_args(load_environment) is None
    with pytest.raises(UsageError, match="rejected its arguments: .*unexpected keyword"):
        load_environment(LENGTH_ENV, bogus=1)
    path = tmp_path / "typed_env.py"
    path.write_text(
        textwrap.dedent("""\
            from __future__ import annotations
            from typing import TYPE_CHECKING

            from reinforge.envs import Environment, Harness, Rubric

            if TYPE_CHECKING:
                from somewhere import Knob


            class Plain(Environment):
                name = "plain"

                def tasks(self, n, seed=0):
                    return []


            def load_environment(knob: Knob | None = None, max_turns: int = 2) -> Plain:
                env = Plain(Harness(max_turns=max_turns), Rubric())
                env.knob = knob
                return env
            """)
    )
    # annotations that do not evaluate declare nothing; its own max_turns is its own
    env = load_environment(str(path), knob="k", max_turns=5)
    assert env.knob == "k" and env.harness.max_turns == 5


def test_the_per_turn_limits_are_env_keys_applied_after_the_load():
    env = load_configured(EnvConfig(name="wordle", max_turns=3, max_tokens_per_turn=7))
    assert (env.harness.max_turns, env.harness.max_tokens_per_turn) == (3, 7)
    assert env.max_guesses == 6  # the game's rule is its own argument
    plain = load_configured(EnvConfig(name="wordle", args={"max_guesses": 4}))
    assert (plain.harness.max_turns, plain.harness.max_tokens_per_turn) == (4, 48)
    assert wordle.Args().max_guesses == 6


def test_the_cli_reports_a_bad_argument_in_one_line_without_a_traceback():
    result = reinforge_here("eval", "tictactoe", "--env-arg", "play_as=Z", "--tasks", "1")
    assert (result.returncode, result.stderr) == (
        2,
        "reinforge eval: error: config env.args.play_as: Input should be 'X', 'O' or 'alternate'\n",
    )
