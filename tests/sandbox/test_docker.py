"""Docker backend. The engine tests skip, with the reason, where no engine is reachable."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from reinforge.sandbox import Rootfs, SandboxError, SandboxSpec
from reinforge.sandbox.docker import DockerProvider, DockerSandbox, run_args


def test_run_args_carry_every_limit() -> None:
    spec = SandboxSpec(
        memory_bytes=256 << 20,
        pids=64,
        cpus=0.5,
        disk_bytes=32 << 20,
        file_size_bytes=1 << 20,
        env={"A": "1"},
    )
    args = run_args(spec, "img:1", "name", "123-456")
    joined = " ".join(args)
    assert "--network none" in joined and "--read-only" in joined
    assert "--memory 268435456b --memory-swap 268435456b" in joined
    assert "--pids-limit 64" in joined and "--cpus 0.5" in joined
    assert "--ulimit fsize=1048576" in joined and "--env A=1" in joined
    assert f"/workspace:rw,size={32 << 20},mode=755" in args
    assert "reinforge.sandbox.owner=123-456" in args
    assert args[-3:] == ["img:1", "sleep", "infinity"]
    assert "bridge" in run_args(SandboxSpec(network="on"), "img", "n", "o")


def test_rootfs_base_is_rejected() -> None:
    with pytest.raises(SandboxError, match="from the image"):
        run_args(SandboxSpec(base=Rootfs(Path("/x"))), "img", "n", "o")


@pytest.fixture
async def docker_sandbox() -> AsyncIterator[DockerSandbox]:
    if shutil.which("docker") is None:
        pytest.skip("no `docker` CLI on PATH, so no Docker engine to test against")
    provider = DockerProvider()
    reason = await provider.available()
    if reason is not None:
        pytest.skip(f"no Docker engine reachable: {reason}")
    sandbox = await provider.create(SandboxSpec(memory_bytes=256 << 20, pids=64))
    yield sandbox
    await provider.aclose()


async def test_docker_exec_files_timeout_and_pause(docker_sandbox: DockerSandbox) -> None:
    result = await docker_sandbox.exec("echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    await docker_sandbox.write_files({"a.txt": b"alpha"})
    assert await docker_sandbox.read_files(["a.txt", "/nope"]) == {"a.txt": b"alpha", "/nope": None}
    looped = await docker_sandbox.exec("while :; do :; done", timeout=0.5)
    assert looped.timed_out and looped.exit_code == 124
    await docker_sandbox.pause()
    await docker_sandbox.resume()
    assert (await docker_sandbox.exec("echo back")).stdout == b"back\n"


async def test_docker_network_off_has_no_route(docker_sandbox: DockerSandbox) -> None:
    probe = "cat /proc/net/route | wc -l"
    result = await docker_sandbox.exec(probe)
    assert result.stdout.strip() == b"1"  # only the header line: no routes at all
