"""`reinforge sandbox run | bench`, driven through the real argument parser."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

import reinforge
from reinforge.commands import sandbox as sandbox_cmd
from reinforge.errors import UsageError
from reinforge.sandbox import LocalProvider


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="reinforge sandbox")
    sandbox_cmd.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    return args.func(args)


def test_run_streams_output_and_returns_the_exit_code(capfd) -> None:
    assert run_cli("sandbox", "run", "--", "sh", "-c", "echo hi; echo oops >&2; exit 3") == 3
    out, err = capfd.readouterr()
    assert out == "hi\n" and "oops" in err


def test_run_exits_124_on_timeout(capfd) -> None:
    assert run_cli("sandbox", "run", "--timeout", "0.5", "--", "sleep", "5") == 124
    assert "timed out" in capfd.readouterr().err


def test_run_network_flag(capfd) -> None:
    interfaces = "grep -c : /proc/net/dev"  # one line per network interface
    assert (
        run_cli("sandbox", "run", "--memory", "64M", "--pids", "16", "--", "sh", "-c", interfaces)
        == 0
    )
    assert capfd.readouterr().out == "1\n"  # loopback only
    assert run_cli("sandbox", "run", "--network", "on", "--", "sh", "-c", interfaces) == 0
    host = sum(":" in line for line in Path("/proc/net/dev").read_text().splitlines())
    assert int(capfd.readouterr().out) == host  # the host's own network stack


def test_run_reports_a_sandbox_failure_as_125(capfd, provider: LocalProvider) -> None:
    if not provider.capabilities.memory_limit:
        pytest.skip("needs a memory cgroup: a 1-byte limit then kills the sandbox's setup")
    assert run_cli("sandbox", "run", "--memory", "1", "--", "true") == 125
    assert "memory" in capfd.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--memory", "lots", "--", "true"), "not a size"),
        (("--pids", "0", "--", "true"), "must be positive"),
        ((), "no command given"),
    ],
)
def test_run_rejects_user_mistakes(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        run_cli("sandbox", "run", *argv)


def test_parse_size() -> None:
    assert sandbox_cmd.parse_size("256M") == 256 << 20
    assert sandbox_cmd.parse_size("1g") == 1 << 30
    assert sandbox_cmd.parse_size("512KiB") == 512 << 10
    assert sandbox_cmd.parse_size("1000") == 1000


def test_bench_prints_a_table_and_writes_json(tmp_path: Path, capfd) -> None:
    out = tmp_path / "bench.json"
    assert run_cli("sandbox", "bench", "--n", "2", "--json", str(out)) == 0
    assert "create -> first exec -> destroy" in capfd.readouterr().out
    results = json.loads(out.read_text())
    for key in ("create_exec_destroy_p50_ms", "exec_p50_ms", "pause_p50_ms", "resume_p50_ms"):
        assert results[key] > 0


def test_module_entry_point(tmp_path: Path) -> None:
    try:
        from reinforge.cli import build_parser

        build_parser()
    except ImportError as error:
        pytest.skip(f"the top-level CLI does not import yet: {error}")
    root = Path(reinforge.__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "reinforge", "sandbox", "run", "--", "sh", "-c", "echo hi"],
        capture_output=True,
        cwd=root,
        stdin=subprocess.DEVNULL,
    )
    assert (done.returncode, done.stdout) == (0, b"hi\n")
