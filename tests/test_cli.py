"""`reinforge eval` as a user runs it: a real subprocess, real files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .commands import ROOT, reinforge_here


def test_eval_writes_trajectories_that_carry_what_training_needs(tmp_path):
    out = tmp_path / "eval"
    result = reinforge_here(
        "eval",
        "arithmetic",
        "--model",
        "tiny-random",
        "--tasks",
        "4",
        "--rollouts",
        "2",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 8
    for line in lines:
        row = json.loads(line)
        for key in (
            "task_id",
            "group_id",
            "token_ids",
            "loss_mask",
            "logprobs",
            "reward",
            "rewards",
            "status",
        ):
            assert key in row
        assert len(row["token_ids"]) == len(row["loss_mask"])
        assert sum(row["loss_mask"]) == len(row["logprobs"]) > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollouts"] == 8 and summary["k"] == 2 and "pass_at_k" in summary
    assert "reward" in result.stdout and "pass@1" in result.stdout


def test_user_environment_by_path_and_by_module(tmp_path):
    by_path = reinforge_here(
        "eval",
        "examples/reverse_env.py",
        "--model",
        "tiny-random",
        "--tasks",
        "2",
        "--out",
        str(tmp_path / "a"),
    )
    assert by_path.returncode == 0, by_path.stderr
    module_dir = tmp_path / "pkg"
    module_dir.mkdir()
    (module_dir / "my_envs.py").write_text(
        (ROOT / "examples" / "reverse_env.py")
        .read_text()
        .replace("def load_environment", "def make_reverse")
    )
    by_module = subprocess.run(
        [
            sys.executable,
            "-m",
            "reinforge",
            "eval",
            "my_envs:make_reverse",
            "--model",
            "tiny-random",
            "--tasks",
            "2",
            "--out",
            str(tmp_path / "b"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=module_dir,
        env={**__import__("os").environ, "PYTHONPATH": str(module_dir)},
    )
    assert by_module.returncode == 0, by_module.stderr
    assert len((tmp_path / "b" / "trajectories.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "nosuchenv", "--model", "tiny-random"], "unknown environment 'nosuchenv'"),
        (["eval", "arithmetic", "--model", "http://127.0.0.1:9/v1"], "cannot reach"),
        (["eval", "arithmetic", "--model", "no/such/folder"], "unknown model"),
        (
            ["eval", "arithmetic", "--tasks", "0"],
            "--tasks: Input should be greater than or equal to 1",
        ),
        (["eval", "arithmetic", "--tasks", "many"], "--tasks: Input should be a valid integer"),
        (["eval", "arithmetic", "--env-arg", "novalue"], "--env-arg takes NAME=VALUE"),
        (["eval", "arithmetic", "--config", "nosuch.toml"], "cannot read config nosuch.toml"),
        (["eval", "arithmetic", "rollout.bogus=1"], "config rollout.bogus: unknown key"),
        (["serve", "--port", "-1"], "--port: Input should be greater than or equal to 0"),
        (
            ["eval", "arithmetic", "--model", "tiny-random", "--env-arg", "bogus=1"],
            "config env.args.bogus: unknown key",
        ),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(args, message):
    result = reinforge_here(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


BROKEN_TASKS = """
from reinforge.envs import Environment


class Broken(Environment):
    def tasks(self, n, seed=0):
        raise ValueError("no data file")


def load_environment():
    return Broken()
"""

FAILING_ROLLOUTS = """
from reinforge.envs import Environment, Harness
from reinforge.types import Task


class Failing(Environment):
    def tasks(self, n, seed=0):
        return [Task(id=str(i), prompt=[{"role": "user", "content": "hi"}]) for i in range(n)]

    async def respond(self, episode):
        raise RuntimeError("respond is broken")


def load_environment():
    return Failing(Harness(max_tokens_per_turn=2))
"""


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def load_environment(:\n", "SyntaxError"),
        ("import os\nimport no_such_module_here\n", "ModuleNotFoundError"),
        ("raise RuntimeError('module-level bug')\n", "RuntimeError: module-level bug"),
        (BROKEN_TASKS, "tasks() raised ValueError: no data file"),
    ],
)
def test_a_broken_environment_file_is_one_line_naming_file_and_line(tmp_path, source, message):
    path = tmp_path / "broken_env.py"
    path.write_text(source)
    result = reinforge_here("eval", str(path), "--model", "tiny-random", "--tasks", "2")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert f"{path}:" in result.stderr  # the file and line to fix


def test_eval_exits_3_when_too_many_rollouts_error(tmp_path):
    path = tmp_path / "failing_env.py"
    path.write_text(FAILING_ROLLOUTS)
    out = tmp_path / "out"
    args = ("eval", str(path), "--model", "tiny-random", "--tasks", "2", "--out", str(out))
    result = reinforge_here(*args)
    assert result.returncode == 3, result.stderr
    assert "2 of 2 rollouts errored" in result.stderr and "respond is broken" in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["errored"] == 2 and summary["scored"] == 0
    assert (
        reinforge_here(
            *args[:-2], "--out", str(tmp_path / "o2"), "eval.max_error_rate=1"
        ).returncode
        == 0
    )
