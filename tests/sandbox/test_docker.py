"""Docker backend. The engine tests skip, with the reason, where no engine is reachable."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from reinforge.envs.harbor.verify import OUTLIVED, QUIESCE
from reinforge.sandbox import Image, Rootfs, SandboxError, SandboxSpec
from reinforge.sandbox.docker import DockerProvider, DockerSandbox, run_args
from reinforge.sandbox.docker_images import build_image, unreachable


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
async def docker_provider(docker_image: str) -> AsyncIterator[DockerProvider]:
    provider = DockerProvider(docker_image)
    yield provider
    await provider.aclose()
    assert not provider.live


@pytest.fixture
async def docker_sandbox(docker_provider: DockerProvider) -> AsyncIterator[DockerSandbox]:
    yield await docker_provider.create(SandboxSpec(memory_bytes=256 << 20, pids=64))


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


@pytest.fixture
def fresh_tag() -> Iterator[str]:
    """A tag no image has yet (`build_image` uses an existing one as it is), removed after."""
    tag = f"reinforge-test/built:{uuid.uuid4().hex[:12]}"
    yield tag
    subprocess.run(["docker", "rmi", "--force", tag], capture_output=True)


def test_no_engine_is_one_line() -> None:
    assert unreachable("no-such-docker") == "no `no-such-docker` executable on PATH"


async def test_writable_dirs_start_with_what_the_image_holds_there(
    docker_image: str, docker_provider: DockerProvider, tmp_path: Path, fresh_tag: str
) -> None:
    """A task image made with RUN steps keeps its files in the workdir and /root, though
    both are tmpfs mounts; the rest of it stays read-only."""
    (tmp_path / "Dockerfile").write_text(
        f"FROM {docker_image}\nWORKDIR /app\n"
        "RUN mkdir -p sub /root && echo made > sub/made.txt && echo rc > /root/.rc\n"
        "ENV GREETING=hello\n"
    )
    built = build_image(tmp_path, fresh_tag, "/app")
    assert (built.workdir, built.env["GREETING"]) == ("/app", "hello")
    assert built.files == {"/app/sub/made.txt"}
    spec = SandboxSpec(base=Image(built.name), workdir="/app", disk_bytes=1 << 20)
    sandbox = await docker_provider.create(spec)
    seen = await sandbox.exec("cat sub/made.txt /root/.rc; echo $GREETING; pwd")
    assert seen.stdout == b"made\nrc\nhello\n/app\n", seen.stderr
    assert (await sandbox.exec("touch /app/new && rm sub/made.txt")).ok
    denied = await sandbox.exec("touch /etc/planted")
    assert denied.exit_code != 0 and b"Read-only file system" in denied.stderr
    full = await sandbox.exec("head -c 2000000 /dev/zero > /app/big")
    assert full.exit_code != 0 and b"No space left" in full.stderr  # the workdir's cap
    fresh = await docker_provider.create(spec)  # each container starts from the image
    assert (await fresh.exec("cat sub/made.txt; ls new")).stdout == b"made\n"


def test_a_workdir_asked_for_wins_over_the_image_s(
    docker_image: str, tmp_path: Path, fresh_tag: str
) -> None:
    """A Harbor task's `[environment] workdir` is its sandboxes' over the image's WORKDIR,
    and the files the image holds there are the ones it shipped."""
    (tmp_path / "Dockerfile").write_text(
        f"FROM {docker_image}\nWORKDIR /app\n"
        "RUN mkdir -p /srv/work && echo a > /srv/work/a.txt && echo b > b.txt\n"
    )
    built = build_image(tmp_path, fresh_tag, "/app", workdir="/srv/work")
    assert (built.workdir, built.files) == ("/srv/work", {"/srv/work/a.txt"})


async def test_killing_every_other_process_leaves_the_container_up(
    docker_sandbox: DockerSandbox,
) -> None:
    """pid 1 is `sleep` itself: a Harbor task's agent phase ends by SIGKILLing everything
    else, and the workspace is then copied out of the same container."""
    started = await docker_sandbox.exec("(sleep 1000 &) ; (sleep 1000 &) ; echo ok")
    assert started.ok
    quiesced = await docker_sandbox.exec(["/bin/sh", "-c", QUIESCE], timeout=30)
    assert quiesced.ok, quiesced.stderr
    left = await docker_sandbox.exec(["/bin/sh", "-c", OUTLIVED])
    assert left.stdout == b"0\n"


def test_a_failed_build_says_why(docker_image: str, tmp_path: Path, fresh_tag: str) -> None:
    (tmp_path / "Dockerfile").write_text(f"FROM {docker_image}\nRUN echo broken-step; exit 3\n")
    with pytest.raises(SandboxError, match="docker build of .* failed: .*"):
        build_image(tmp_path, fresh_tag, "/app")


async def test_no_variable_of_the_host_process_reaches_a_docker_sandbox(
    docker_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The trainer's environment holds tracker, judge and cloud keys; the docker CLI runs
    # with it, but a container's processes get the image's ENV and each command's own.
    marker = "planted-trainer-secret-4c7d"
    monkeypatch.setenv("REINFORGE_TEST_PLANTED_SECRET", marker)
    provider = DockerProvider(docker_image)
    try:
        sandbox = await provider.create(SandboxSpec(memory_bytes=256 << 20, pids=64))
        # The secret comes on stdin, so no command line in the scan holds it; the shell's
        # own environ is the command's environment.
        scan = "grep -alF -f - /proc/[0-9]*/environ /proc/[0-9]*/cmdline; echo done"
        result = await sandbox.exec(scan, stdin=marker.encode() + b"\n")
        assert (result.stdout, result.stderr) == (b"done\n", b""), result
        planted = await sandbox.exec(scan, stdin=b"HOSTNAME\n")  # the scan finds a variable
        assert b"/environ" in planted.stdout, planted
    finally:
        await provider.aclose()
