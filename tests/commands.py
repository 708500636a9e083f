"""The `reinforge` command as a user runs it: its `main` in the test's process for what a
command computes and writes, and a subprocess from the repository root where the process
itself is what is tested (a run killed or interrupted, an engine served)."""

from __future__ import annotations

import io
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
LENGTH_ENV = str(ROOT / "tests" / "data" / "length_env.py")
"""A test environment whose reward is the completion's length: groups always differ."""


def reinforge_here(*args: str) -> subprocess.CompletedProcess[str]:
    """`reinforge ARGS` run by its `main` in this process, as its own process would run it:
    its exit code and what it wrote to stdout and stderr. For tests of what a command
    computes and writes, which in a process of their own would each pay the model stack's
    imports (~8 s of CPU here) first. `python -m reinforge` itself (help and config errors
    before heavy imports, Ctrl-C, a killed run) is tested in subprocesses
    (tests/test_command_line.py, `tiny_train`); the engines, sandboxes and harnesses a
    command starts are processes as ever. What this cannot catch is a command that works
    only because this process imported something first; those subprocess tests would."""
    import torch

    from reinforge.cli import main

    out, err = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()  # the command sets its own (`model.threads`)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as leaving:  # argparse's own errors and --help
                code = leaving.code if isinstance(leaving.code, int | None) else 1
    finally:
        torch.set_num_threads(threads)
    said = (out.getvalue(), err.getvalue())
    return subprocess.CompletedProcess(["reinforge", *args], code or 0, *said)


def run_here(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`argv`, a `python -m reinforge` command line as `tiny_train` gives it, run by
    `reinforge_here`."""
    assert argv[:3] == [sys.executable, "-m", "reinforge"], argv
    return reinforge_here(*argv[3:])


def loaded_by(modules: str, among: Iterable[str]) -> list[str]:
    """Which of `among` importing `modules` (comma-separated) loads, in a fresh interpreter
    from the repository root: what a process that needs only those modules pays for."""
    listed = f"json.dumps([m for m in {list(among)!r} if m in sys.modules])"
    code = f"import json, sys, {modules}\nprint({listed})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def tiny_train(run_dir: Path, *overrides: str) -> list[str]:
    """argv of a short `reinforge train` of the tiny model on `LENGTH_ENV`, writing
    `run_dir/r`; later overrides win over these defaults."""
    return [
        sys.executable,
        "-m",
        "reinforge",
        "train",
        "model.name=tiny-random",
        f"env.name={LENGTH_ENV}",
        "run.steps=2",
        f"run.dir={run_dir}",
        "run.name=r",
        "rollout.tasks_per_step=2",
        *overrides,
    ]


@contextmanager
def serving(*args: str) -> Iterator[str]:
    """`reinforge serve --model tiny-random ARGS` on a free port, as a user starts it;
    yields its base URL once /health answers, and stops it after."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "reinforge", "serve", "--model", "tiny-random"]
        + ["--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if process.poll() is not None:
                assert process.stderr is not None
                raise RuntimeError(f"server exited: {process.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def kill_after(process: subprocess.Popen[str], metrics: Path, steps: int) -> None:
    """kill -9 `process` once `metrics` (its metrics.jsonl) holds `steps` lines."""
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= steps:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
