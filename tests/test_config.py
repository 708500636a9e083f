"""The config trees: one home per value, commands' flags as names of config keys."""

from __future__ import annotations

from typing import get_args

import pytest
import torch

from reinforge.cli import build_parser, parse
from reinforge.commands import eval as eval_command
from reinforge.commands import serve as serve_command
from reinforge.config import Config, EvalConfig, ServeConfig, load_config
from reinforge.config_reference import reference
from reinforge.envs.config import EnvConfig
from reinforge.envs.environment import Harness
from reinforge.envs.registry import load_configured
from reinforge.errors import UsageError
from reinforge.policy.models import resolve_device
from reinforge.train.algorithm import ConstantNorm
from reinforge.train.config import TrainerConfig

from .commands import ROOT, reinforge


@pytest.mark.parametrize(
    ("command", "root"), [(eval_command, EvalConfig), (serve_command, ServeConfig)]
)
def test_every_flag_names_a_config_key_and_shows_its_default(command, root):
    help_text = " ".join(reinforge(command.__name__.rsplit(".", 1)[1], "--help").stdout.split())
    defaults = root()
    for flag in command.FLAGS:
        value = defaults
        *sections, name = flag.key.split(".")
        for part in sections:  # a section that is off by default shows its class's defaults
            section = getattr(value, part)
            if section is None:
                annotation = type(value).model_fields[part].annotation
                (kind,) = [t for t in get_args(annotation) if t is not type(None)]
                section = kind()
            value = section
        value = getattr(value, name)
        shown = "none" if value is None else value
        assert f"(default: {shown}; key {flag.key})" in help_text, flag.name


def test_flags_config_file_and_overrides_stack_in_order(tmp_path):
    path = tmp_path / "eval.toml"
    path.write_text("[rollout]\nconcurrency = 3\ntimeout_s = 5.0\n[eval]\ntasks = 7\n")
    args = parse(
        build_parser(),
        ["eval", "calculator", "--config", str(path), "--tasks", "9", "--temperature", "0.5",
         "--env-arg", "max_turns=2", "rollout.timeout_s=7"],
    )  # fmt: skip
    config = eval_command.load(args)
    assert config.env.name == "calculator" and config.env.args == {"max_turns": 2}
    assert config.rollout.concurrency == 3  # the file
    assert config.eval.tasks == 9  # a flag wins over the file
    assert config.rollout.sampling.temperature == 0.5
    assert config.rollout.timeout_s == 7.0  # an override wins over the file
    assert config.eval.rollouts_per_task == 1


def test_eval_and_serve_reject_unknown_keys_like_train():
    for command in ("train", "eval", "serve"):
        result = reinforge(command, "engine.nosuch=1")
        assert result.returncode == 2, command
        assert result.stderr.strip().endswith("config engine.nosuch: unknown key"), command


def test_per_turn_tokens_have_one_knob():
    env = load_configured(EnvConfig(name="arithmetic", max_tokens_per_turn=7))
    assert env.harness.max_tokens_per_turn == 7
    unchanged = load_configured(EnvConfig(name="arithmetic"))
    assert unchanged.harness.max_tokens_per_turn == 48  # the environment's own
    with pytest.raises(UsageError, match="max_tokens"):
        load_configured(EnvConfig(name="arithmetic", args={"max_tokens": 7}))


def test_constant_norm_takes_the_harness_budget_unless_given():
    config = load_config(
        Config, None, ['trainer.algorithm.loss.aggregation.kind="constant_norm"']
    ).trainer
    harness = Harness(max_turns=3, max_tokens_per_turn=10)
    assert harness.max_sampled_tokens == 30
    assert (
        Harness(max_turns=3, max_tokens_per_turn=10, max_total_tokens=25).max_sampled_tokens == 25
    )
    resolved = config.for_budget(harness.max_sampled_tokens)
    assert resolved.algorithm.loss.aggregation == ConstantNorm(max_tokens=30)
    given = TrainerConfig.model_validate(
        {"algorithm": {"loss": {"aggregation": {"kind": "constant_norm", "max_tokens": 8}}}}
    )
    assert given.for_budget(30).algorithm.loss.aggregation.max_tokens == 8
    assert TrainerConfig().for_budget(30) == TrainerConfig()


def test_model_device_resolves_in_one_place_and_bad_names_are_one_line():
    default = load_config(Config, None, []).model.device
    assert default == "auto"
    assert resolve_device(default).type == ("cuda" if torch.cuda.is_available() else "cpu")
    cpu = load_config(Config, None, ['model.device="cpu"']).model.device
    assert resolve_device(cpu) == torch.device("cpu")
    with pytest.raises(UsageError) as bad:
        load_config(Config, None, ['model.device="gpu"'])
    assert str(bad.value) == "config model.device: expected auto, cpu, cuda or cuda:N, got 'gpu'"
    with pytest.raises(UsageError, match="^config model: vLLM chooses its own device"):
        load_config(Config, None, ['model.engine="vllm"', 'model.device="cpu"'])
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="^model.device is cuda:1 but torch sees no CUDA"):
            resolve_device("cuda:1")
    with pytest.raises(UsageError) as sharded:  # at load, before any rank starts
        load_config(Config, None, ["trainer.world_size=2", 'model.device="cpu"'])
    assert str(sharded.value) == (
        "config: model.device is cpu: a sharded trainer (trainer.world_size 2) puts each rank "
        "on its own GPU, or the CPU; leave it at auto"
    )


def test_the_config_reference_is_current():
    """docs/config.md is generated from the config classes; regenerate it with
    `python -m reinforge.config_reference > docs/config.md`."""
    assert (ROOT / "docs" / "config.md").read_text(encoding="utf-8") == reference()


def test_options_may_sit_between_positional_arguments():
    args = parse(build_parser(), ["train", "run.toml", "--resume", "run.steps=3"])
    assert args.resume and str(args.config) == "run.toml" and args.overrides == ["run.steps=3"]
    args = parse(build_parser(), ["eval", "arithmetic", "--tasks", "2", "eval.seed=1"])
    assert args.env == "arithmetic" and args.overrides == ["eval.seed=1"]
