"""The config trees: one home per value, commands' flags as names of config keys."""

from __future__ import annotations

from typing import get_args

import pytest
import torch

from reinforge.cli import build_parser, main, parse
from reinforge.commands import eval as eval_command
from reinforge.commands import serve as serve_command
from reinforge.config import Config, EvalConfig, ServeConfig, load_config
from reinforge.config_reference import reference
from reinforge.envs.config import EnvConfig
from reinforge.envs.environment import Harness
from reinforge.envs.registry import load_configured
from reinforge.errors import ConfigError, UsageError
from reinforge.orchestrate.config import (
    AsyncLoop,
    InProcessEngine,
    PartialLoop,
    Resources,
    ServedEngine,
    SpawnedEngines,
    SyncLoop,
)
from reinforge.orchestrate.engine_processes import engine_settings
from reinforge.policy.config import AtOnce, EngineConfig, Grouped
from reinforge.policy.models import resolve_device
from reinforge.train.config import TrainerConfig
from reinforge.train.token_weights import ConstantNorm

from .commands import ROOT, reinforge_here


@pytest.mark.parametrize(
    ("command", "root"), [(eval_command, EvalConfig), (serve_command, ServeConfig)]
)
def test_every_flag_names_a_config_key_and_shows_its_default(command, root):
    help_text = " ".join(
        reinforge_here(command.__name__.rsplit(".", 1)[1], "--help").stdout.split()
    )
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
        result = reinforge_here(command, "engine.nosuch=1")
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


def test_every_example_config_loads_and_the_main_job_runs_in_one_process():
    for path in sorted((ROOT / "examples").glob("*.toml")):
        load_config(Config, path, [])
    main_job = load_config(Config, ROOT / "examples" / "arithmetic.toml", [])
    assert main_job.loop == SyncLoop() and main_job.engines == InProcessEngine()


def test_the_loop_and_the_engines_are_variants_chosen_by_their_tag():
    def load(*overrides: str) -> Config:
        return load_config(Config, None, list(overrides))

    assert load("loop.mode=async", "loop.max_staleness=2").loop == AsyncLoop(max_staleness=2)
    partial = load("loop.mode=partial", "loop.pause_lease_s=60", "loop.uniform_redraws=2")
    assert partial.loop == PartialLoop(pause_lease_s=60.0, uniform_redraws=2)
    assert load("loop.max_error_rate=0.5").loop == SyncLoop(max_error_rate=0.5)  # no tag
    served = load("engines.kind=served", "engines.url=http://127.0.0.1:8000/v1", "engines.token=t")
    assert served.engines == ServedEngine(url="http://127.0.0.1:8000/v1", token="t")
    spawned = load("engines.kind=spawned", "engines.count=2", "engines.resources.gpus=1")
    assert spawned.engines == SpawnedEngines(count=2, resources=Resources(gpus=1.0))
    assert load("engines.kind=spawned").engines == SpawnedEngines()
    assert load("engine.admit.wait_steps=2").engine.admit == Grouped(wait_steps=2)  # no tag
    assert load("engine.admit=at_once").engine.admit == AtOnce()


SERVED = ["engines.kind=served", "engines.url=http://x/v1"]


@pytest.mark.parametrize(
    ("overrides", "key", "holders", "chosen"),
    [
        (
            ["loop.max_staleness=2"],
            "loop.max_staleness",
            'loop.mode = "async" or "partial"',
            "sync",
        ),
        (["loop.pause_lease_s=60"], "loop.pause_lease_s", 'loop.mode = "partial"', "sync"),
        (
            ["loop.mode=async", "loop.pause_lease_s=60"],
            "loop.pause_lease_s",
            'loop.mode = "partial"',
            "async",
        ),
        (["engines.url=http://x/v1"], "engines.url", 'engines.kind = "served"', "in_process"),
        (["engines.token=t"], "engines.token", 'engines.kind = "served"', "in_process"),
        (["engines.count=2"], "engines.count", 'engines.kind = "spawned"', "in_process"),
        (["engines.restarts=0"], "engines.restarts", 'engines.kind = "spawned"', "in_process"),
        (
            ["engines.resources.gpus=1"],
            "engines.resources",
            'engines.kind = "spawned"',
            "in_process",
        ),
        ([*SERVED, "engines.count=2"], "engines.count", 'engines.kind = "spawned"', "served"),
        ([*SERVED, "engines.restarts=0"], "engines.restarts", 'engines.kind = "spawned"', "served"),
        (
            ["engines.kind=spawned", "engines.url=x"],
            "engines.url",
            'engines.kind = "served"',
            "spawned",
        ),
        (
            ["engines.kind=spawned", "engines.token=t"],
            "engines.token",
            'engines.kind = "served"',
            "spawned",
        ),
        (
            ["engines.kind=spawned", "engines.weight_sync.timeout_s=3"],
            "engines.weight_sync.timeout_s",
            'engines.weight_sync.kind = "broadcast"',
            "file",
        ),
        (
            ["engine.admit.kind=at_once", "engine.admit.size=4"],
            "engine.admit.size",
            'engine.admit.kind = "grouped"',
            "at_once",
        ),
    ],
)
def test_a_key_of_another_variant_is_one_line_naming_the_variants_that_hold_it(
    overrides, key, holders, chosen, capsys
):
    error = f'config {key}: a key of {holders}, not of "{chosen}"'
    with pytest.raises(ConfigError) as refused:
        load_config(Config, None, overrides)
    assert str(refused.value) == error
    assert main(["train", *overrides]) == 2  # as a user meets it: one line, no traceback
    assert capsys.readouterr().err == f"reinforge train: error: {error}\n"


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (["loop.mode=partial", "loop.url=x"], "loop.url: unknown key"),
        (["loop.mode=sometimes"], "loop.mode: 'sometimes' is none of 'sync', 'async', 'partial'"),
        (
            ["engines.kind=local"],
            "engines.kind: 'local' is none of 'in_process', 'served', 'spawned'",
        ),
        (["engines.kind=served"], "engines.url: Field required"),
    ],
)
def test_an_unknown_key_or_tag_of_a_variant_is_one_line(overrides, error):
    with pytest.raises(ConfigError) as refused:
        load_config(Config, None, overrides)
    assert str(refused.value) == f"config {error}"


SPAWNED = 'engines.kind = "spawned"'


@pytest.mark.parametrize(
    ("toml", "key", "new", "variant"),
    [
        (
            '[loop]\nengine_url = "http://x/v1"',
            "loop.engine_url",
            "engines.url",
            'engines.kind = "served"',
        ),
        (
            '[loop]\nengine_token = "t"',
            "loop.engine_token",
            "engines.token",
            'engines.kind = "served"',
        ),
        ("[rollout]\nengines = 2", "rollout.engines", "engines.count", SPAWNED),
        ("[rollout]\nengine_restarts = 0", "rollout.engine_restarts", "engines.restarts", SPAWNED),
        ("[cluster.engine]\ngpus = 1", "cluster.engine", "engines.resources", SPAWNED),
        (
            "[engine]\nadmit_group = 4",
            "engine.admit_group",
            "engine.admit.size",
            'kind = "grouped"',
        ),
        (
            "[engine]\nadmit_wait_steps = 2",
            "engine.admit_wait_steps",
            "engine.admit.wait_steps",
            'kind = "grouped"',
        ),
    ],
)
def test_a_moved_key_is_one_line_naming_its_new_key(toml, key, new, variant, tmp_path, capsys):
    error = f"config {key}: moved to {new} (with {variant})"
    path = tmp_path / "old.toml"
    path.write_text(toml + "\n")
    with pytest.raises(ConfigError) as refused:
        load_config(Config, path, [])
    assert str(refused.value) == error
    assert main(["train", str(path)]) == 2
    assert capsys.readouterr().err == f"reinforge train: error: {error}\n"
    section, _, rest = toml.partition("]\n")
    override = f"{section[1:]}.{rest.replace(' = ', '=')}"  # the same key as an override
    with pytest.raises(ConfigError, match=f"^config {key}: moved to {new} "):
        load_config(Config, None, [override])


def test_a_sharded_trainer_samples_from_spawned_engines():
    sharded = load_config(Config, None, ["trainer.world_size=2"])
    assert sharded.engines == SpawnedEngines()  # its weights are not in the run's process
    served = load_config(Config, None, ["trainer.world_size=2", *SERVED])
    assert isinstance(served.engines, ServedEngine)
    with pytest.raises(ConfigError) as refused:
        load_config(Config, None, ["trainer.world_size=2", "engines.kind=in_process"])
    assert str(refused.value) == (
        'config: engines.kind is "in_process": a sharded trainer (trainer.world_size 2) holds '
        'its weights in its ranks, not in the run\'s process; use engines.kind = "spawned" '
        '(its default) or "served"'
    )


def test_the_admission_rule_of_each_variant():
    """(waiting, room, running, waited steps): the engine and the simulator ask the same."""
    grouped = Grouped(size=4, wait_steps=2)
    assert grouped.admits(1, 10, 0, 0)  # an idle engine takes what comes
    assert not grouped.admits(3, 10, 5, 1)  # too few, not waited long enough
    assert grouped.admits(3, 10, 5, 2)  # ...or waited long enough
    assert grouped.admits(4, 10, 5, 0)  # a group
    assert grouped.admits(2, 2, 5, 0)  # as many as there is room for
    assert not grouped.admits(4, 0, 64, 9)  # no room
    assert not grouped.admits(0, 10, 0, 9)  # nothing waits
    at_once = AtOnce()
    assert at_once.admits(1, 10, 5, 0)
    assert not at_once.admits(1, 0, 64, 0)
    assert not at_once.admits(0, 10, 5, 0)


def test_an_engine_samples_in_bfloat16_on_a_gpu_and_float32_on_a_cpu_unless_told():
    assert (EngineConfig().dtype_on(gpu=True), EngineConfig().dtype_on(gpu=False)) == (
        "bfloat16",
        "float32",
    )
    for dtype in ("float32", "bfloat16"):
        told = EngineConfig(dtype=dtype)
        assert told.dtype_on(gpu=True) == told.dtype_on(gpu=False) == dtype
    # spawned engines are told the dtype settled for where they run, and their weights are
    # cast to it
    config = load_config(Config, None, ["engines.kind=spawned"])
    assert engine_settings(config, "t", gpu=True).engine.dtype == "bfloat16"
    assert engine_settings(config, "t", gpu=False).engine.dtype == "float32"
