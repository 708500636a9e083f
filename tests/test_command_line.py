"""The command line before any work: `--help` and a config mistake answer at once, without
loading torch (or any other heavy library), and every override either takes effect or is
refused in one line naming it."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

from reinforge.cli import COMMANDS, build_parser, main, parse
from reinforge.commands import eval as eval_command
from reinforge.commands import serve as serve_command
from reinforge.commands.config_args import load_command_config, load_with_flags
from reinforge.config import ServeConfig
from reinforge.errors import UsageError
from reinforge.orchestrate.sft import sft_config

from .commands import ROOT, loaded_by

HEAVY = ("torch", "transformers", "vllm", "ray", "openai", "fastapi", "uvicorn")
"""What only a command's work needs: seconds of imports a `--help` must not wait for."""
QUICK_S = 5.0
"""Generous: about 0.3 s of CPU here, where importing torch alone took seconds."""
PROBE = f"""
import json, sys
from reinforge.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print(json.dumps({{"code": code, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""
"""The command line as `python -m reinforge` runs it, then, as the last line of stdout,
its exit code and the heavy modules it loaded."""


UNKNOWN_MODEL = (
    "unknown model 'no/such/folder': not one of smollm2-135m, tiny-random, not a folder "
    "holding a Hugging Face model (config.json), nor a run directory with checkpoints"
)
URL = "http://127.0.0.1:9/v1"
"""A server's URL; refusing an override happens before anything connects to it."""


def probe(*args: str) -> tuple[dict, subprocess.CompletedProcess[str], float]:
    """What `PROBE` found, the process, and the CPU seconds it took: the work it did, which
    other jobs on a busy machine stretch far less than its wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return json.loads(done.stdout.splitlines()[-1]), done, seconds


@pytest.mark.parametrize(
    "command",
    [*COMMANDS, None, "sandbox run", "sandbox bench", "sim calibrate", "sim predict"],
)
def test_help_answers_at_once_without_heavy_imports(command):
    found, done, seconds = probe(*(command.split() if command else []), "--help")
    assert found["code"] == 0, done.stderr
    assert "usage: reinforge" in done.stdout
    assert found["heavy"] == []
    assert seconds < QUICK_S


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "examples/arithmetic.toml", "trainer.lrr=1"], "config trainer.lrr: unknown key"),
        (["sft", "examples/sft.toml", "sft.epoch=2"], "config sft.epoch: unknown key"),
        (["eval", "arithmetic", "engine.nosuch=1"], "config engine.nosuch: unknown key"),
        (["serve", "--port", "-1"], "--port: Input should be greater than or equal to 0"),
        (["sim", "engine.nosuch=1"], "config engine.nosuch: unknown key"),
        (["train", "examples/arithmetic.toml", "model.name=no/such/folder"], UNKNOWN_MODEL),
        (["sft", "examples/sft.toml", "model.name=no/such/folder"], UNKNOWN_MODEL),
        (["eval", "arithmetic", "--model", "no/such/folder"], UNKNOWN_MODEL),
        (["serve", "--model", "no/such/folder"], UNKNOWN_MODEL),
    ],
)
def test_a_config_mistake_is_one_line_before_heavy_imports(args, message):
    found, done, seconds = probe(*args)
    assert found["code"] == 2
    assert done.stderr == f"reinforge {args[0]}: error: {message}\n"
    assert found["heavy"] == []
    assert seconds < QUICK_S


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "examples/arithmetic.toml", "env.args.bogus=1"], "env.args.bogus: unknown key"),
        (["eval", "arithmetic", "--env-arg", "bogus=1"], "env.args.bogus: unknown key"),
    ],
)
def test_an_environment_argument_mistake_is_one_line_before_the_model_stack(args, message):
    """The environment's loader says what arguments it takes, and environments are written
    against the OpenAI client, so that much is loaded; no model library is."""
    found, done, seconds = probe(*args)
    assert found["code"] == 2
    assert done.stderr == f"reinforge {args[0]}: error: config {message}\n"
    assert set(found["heavy"]) <= {"openai"}
    assert seconds < QUICK_S


def test_the_config_modules_import_no_torch():
    modules = "reinforge.config, reinforge.sim.config, reinforge.commands.config_args"
    assert loaded_by(modules, HEAVY) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "sft.epochs=2"], "sft.epochs: read by `reinforge sft` only"),
        (
            ["sft", "examples/sft.toml", "run.steps=1"],
            "run.steps: sft takes its steps from the data: set sft.epochs or sft.batch_size",
        ),
        (
            ["sft", "rollout.tasks_per_step=2"],
            "rollout.tasks_per_step: not read by sft, which samples nothing",
        ),
        (
            ["sft", "trainer.truncated=mask"],
            "trainer.truncated: not read by sft, which trains on no rewards",
        ),
        (
            ["serve", "model.served_name=x"],
            "model.served_name: read by `reinforge eval` only, for a model served at a URL",
        ),
        (
            ["sim", "loop.mode=async"],
            "loop.mode: sim predict simulates the modes of sim.modes (--mode)",
        ),
        (["sim", "calibrate", "--devices", "2"], "--devices: not read by sim calibrate"),
        (
            ["eval", "arithmetic", "--model", URL, "--dtype", "bfloat16"],
            "--dtype: not read for a model served at a URL, which runs with its server's settings",
        ),
        (
            ["eval", "arithmetic", "--model", URL, "model.threads=1"],
            "model.threads: not read for a model served at a URL, which runs with its "
            "server's settings",
        ),
        (
            ["eval", "arithmetic", "--model", "tiny-random", "--model-name", "x"],
            "--model-name: read for a model served at a URL only (--model http://.../v1)",
        ),
        (
            ["eval", "arithmetic", "--agent", "oracle", "--model", "tiny-random"],
            "--model: not read: a scripted agent (eval.agent oracle or nop) loads no model",
        ),
        (
            ["train", "engines.kind=spawned", "engines.resources.cpus=2"],
            "engines.resources.cpus: not read by the local backend, whose processes share "
            "this machine, only by Ray's",
        ),
        (
            ["sft", "trainer.collective_timeout_s=5"],
            "trainer.collective_timeout_s: not read by a trainer of one process, only by a "
            "sharded one (trainer.world_size > 1)",
        ),
        (
            ["serve", "engine.vllm.kv_cache_mib=2048"],
            "engine.vllm.kv_cache_mib: not read by the built-in engine, only by "
            'model.engine = "vllm"',
        ),
        (
            ["train", "model.engine=vllm", "engine.admit.size=2"],
            "engine.admit.size: not read by vLLM, which admits requests itself, only by "
            'model.engine = "builtin"',
        ),
        (
            ["train", "engines.kind=served", f"engines.url={URL}", "engine.max_batch=4"],
            'engine.max_batch: not read with engines.kind = "served": the server samples '
            "with its settings",
        ),
    ],
)
def test_an_override_the_command_does_not_read_is_refused_in_one_line(args, message, capsys):
    assert main(args) == 2
    assert capsys.readouterr().err == f"reinforge {args[0]}: error: {message}\n"


def test_an_override_the_command_reads_takes_effect():
    """Each command reads the keys `UNREAD` does not list for the way it runs (an eval of a
    model served at a URL reads `model.served_name`); `sim` is in test_sim.py."""
    args = parse(build_parser(), ["train", "examples/arithmetic.toml", "run.steps=3"])
    assert load_command_config(args).run.steps == 3
    args = parse(build_parser(), ["sft", "examples/sft.toml", "sft.epochs=3", "sft.batch_size=4"])
    assert sft_config(load_command_config(args), examples=10).run.steps == 9  # 3 x 3
    args = parse(build_parser(), ["eval", "arithmetic", "eval.seed=4", "--tasks", "2"])
    config = eval_command.load(args)
    assert (config.eval.seed, config.eval.tasks) == (4, 2)
    args = parse(build_parser(), ["eval", "arithmetic", "--model", URL, "--model-name", "m"])
    assert eval_command.load(args).model.served_name == "m"
    served = ["train", "engines.kind=served", f"engines.url={URL}"]
    args = parse(
        build_parser(),
        [*served, "engine.dtype=bfloat16", f"distill.teachers=[{{model = '{URL}'}}]"],
    )
    with pytest.raises(UsageError, match="engine.dtype: not read with engines.kind"):
        load_command_config(args)  # a teacher at a URL: nothing here reads it
    teacher = "distill.teachers=[{model = 'tiny-random'}]"
    args = parse(build_parser(), [*served, "engine.dtype=bfloat16", teacher])
    assert load_command_config(args).engine.dtype == "bfloat16"  # the teacher's
    args = parse(build_parser(), ["serve", "model.engine=vllm", "engine.vllm.kv_cache_mib=99"])
    assert load_with_flags(ServeConfig, args, serve_command.FLAGS).engine.vllm.kv_cache_mib == 99
    args = parse(build_parser(), ["train", "engines.kind=spawned", "engine.admit.size=2"])
    assert load_command_config(args).engine.admit.size == 2  # the built-in engine's
    ray = ["train", "cluster.backend=ray", "cluster.address=auto", "trainer.world_size=2"]
    args = parse(build_parser(), [*ray, "cluster.rank.cpus=2", "trainer.collective_timeout_s=5"])
    config = load_command_config(args)
    assert (config.cluster.rank.cpus, config.trainer.collective_timeout_s) == (2, 5)
    args = parse(build_parser(), ["serve", "server.port=9", "--max-batch", "3"])
    config = load_with_flags(ServeConfig, args, serve_command.FLAGS)
    assert (config.server.port, config.engine.max_batch) == (9, 3)
