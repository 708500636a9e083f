"""The `Sandbox` API on the local backend: commands, files, pause, lifecycle."""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from reinforge.sandbox import (
    LocalProvider,
    LocalSandbox,
    SandboxClosed,
    SandboxError,
    SandboxPaused,
    SandboxSpec,
)
from reinforge.sandbox import _helper as wire
from reinforge.sandbox.channel import Channel
from reinforge.sandbox.reaper import pid_namespace_members

from .helpers import host_pid_alive, make_tar, needs_python3


async def test_exec_reports_exit_code_and_both_streams(sandbox: LocalSandbox) -> None:
    result = await sandbox.exec("echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    assert not result.timed_out and not result.truncated and not result.ok


async def test_exec_argv_cwd_env_and_stdin(sandbox: LocalSandbox) -> None:
    result = await sandbox.exec(
        ["sh", "-c", 'pwd; echo "$GREETING"; cat'],
        cwd="/tmp",
        env={"GREETING": "hello"},
        stdin=b"from stdin",
    )
    assert result.stdout == b"/tmp\nhello\nfrom stdin"
    assert (await sandbox.exec("pwd")).stdout == b"/workspace\n"


async def test_missing_command_is_127_with_a_message(sandbox: LocalSandbox) -> None:
    result = await sandbox.exec(["no-such-command-xyz"])
    assert result.exit_code == 127
    assert b"no-such-command-xyz" in result.stderr


async def test_output_beyond_the_cap_is_truncated(sandbox: LocalSandbox) -> None:
    result = await sandbox.exec("head -c 100000 /dev/zero", max_output_bytes=1000)
    assert result.truncated and result.stdout == b"\0" * 1000 and result.exit_code == 0


async def test_output_streams_to_the_callback(sandbox: LocalSandbox) -> None:
    chunks: list[tuple[str, bytes]] = []
    await sandbox.exec("echo a; echo b >&2", on_output=lambda name, c: chunks.append((name, c)))
    assert ("stdout", b"a\n") in chunks and ("stderr", b"b\n") in chunks


async def test_killed_by_signal_is_128_plus_signal(sandbox: LocalSandbox) -> None:
    assert (await sandbox.exec("kill -9 $$")).exit_code == 137


async def test_write_and_read_files(sandbox: LocalSandbox) -> None:
    await sandbox.write_files({"notes/a.txt": b"alpha", "/tmp/b.sh": b"echo beta"}, mode=0o755)
    got = await sandbox.read_files(["notes/a.txt", "/tmp/b.sh", "/nope", "/workspace"])
    assert got == {
        "notes/a.txt": b"alpha",
        "/tmp/b.sh": b"echo beta",
        "/nope": None,
        "/workspace": None,
    }
    assert (await sandbox.exec("/tmp/b.sh")).stdout == b"beta\n"
    head = await sandbox.read_files(["notes/a.txt"], max_bytes=2)
    assert head == {"notes/a.txt": b"al"}


async def test_upload_and_download_tar(sandbox: LocalSandbox) -> None:
    await sandbox.upload_tar(make_tar({"repo/x.py": b"print(1)", "repo/y/z": b"z"}), "/workspace")
    assert (await sandbox.exec("cat repo/x.py repo/y/z")).stdout == b"print(1)z"
    with tarfile.open(fileobj=io.BytesIO(await sandbox.download_tar("repo"))) as tar:
        assert sorted(tar.getnames()) == ["repo", "repo/x.py", "repo/y", "repo/y/z"]
        member = tar.extractfile("repo/x.py")
        assert member is not None and member.read() == b"print(1)"


async def test_pause_blocks_commands_until_resume(sandbox: LocalSandbox) -> None:
    await sandbox.pause()
    await sandbox.pause()  # idempotent
    with pytest.raises(SandboxPaused):
        await sandbox.exec("true")
    await sandbox.resume()
    await sandbox.resume()
    assert (await sandbox.exec("echo back")).stdout == b"back\n"


async def test_timeout_counts_only_unpaused_time(sandbox: LocalSandbox) -> None:
    # 1.3 s pass on the wall clock, but the command runs unpaused for well under its
    # 1 s budget: time spent frozen (the model thinking) must not count.
    run = asyncio.ensure_future(sandbox.exec("sleep 0.3; echo done", timeout=1.0))
    await asyncio.sleep(0.1)
    await sandbox.pause()
    await asyncio.sleep(1.2)
    await sandbox.resume()
    result = await run
    assert result.stdout == b"done\n" and not result.timed_out


async def test_close_is_idempotent_and_final(provider: LocalProvider) -> None:
    sandbox = await provider.create()
    await sandbox.exec("sleep 1000 &")
    init = sandbox.init_pid
    assert init is not None
    await sandbox.close()
    await sandbox.close()
    assert not host_pid_alive(init)
    assert not sandbox.state_dir.exists()
    assert sandbox.id not in provider.live
    with pytest.raises(SandboxClosed):
        await sandbox.exec("true")


async def test_cancelled_exec_kills_the_command(sandbox: LocalSandbox) -> None:
    task = asyncio.ensure_future(sandbox.exec(["sleep", "1000"]))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):  # the kill is asynchronous; wait until pid 1 is alone again
        remaining = await sandbox.exec("ps -e -o comm= | grep -c '^sleep$'")
        if remaining.stdout.strip() == b"0":
            break
        await asyncio.sleep(0.01)
    assert remaining.stdout.strip() == b"0"


async def test_cancelled_create_leaks_nothing(provider: LocalProvider) -> None:
    def ours() -> set[Path]:  # other runs on the host share the state dir
        return {p for p in provider.state_dir.iterdir() if p.name.startswith(provider.owner + ".")}

    before = ours()
    for delay in (0.0, 0.005, 0.02):
        task = asyncio.ensure_future(provider.create())
        await asyncio.sleep(delay)
        task.cancel()
        try:
            sandbox = await task
        except asyncio.CancelledError:
            continue
        await sandbox.close()  # finished before the cancel landed
    assert ours() == before
    assert not [s for s in provider.live.values() if s.state_dir not in before]


async def test_ready_before_pid_still_learns_pid_1(provider: LocalProvider, monkeypatch) -> None:
    """pid 1 and its parent report on one socket; busy cores can deliver READY first."""
    real = Channel.next_setup_message
    held: dict[Channel, tuple[int, int, bytes]] = {}

    async def ready_first(channel: Channel) -> tuple[int, int, bytes]:
        message = await real(channel)
        if message[0] == wire.K_PID and channel not in held:
            held[channel] = message
            message = await real(channel)
            assert message[0] == wire.K_READY
            channel._setup.put_nowait(held[channel])
        return message

    monkeypatch.setattr(Channel, "next_setup_message", ready_first)
    sandbox = await provider.create()
    try:
        assert held, "the handshake never saw PID"
        assert sandbox.init_pid is not None
        assert sandbox.init_pid in pid_namespace_members(sandbox.init_pid)
        meta = json.loads((sandbox.state_dir / "meta.json").read_text())
        assert meta["init_pid"] == sandbox.init_pid  # recorded, so a crash is reaped
        assert (await sandbox.exec("echo ok")).stdout == b"ok\n"
    finally:
        await sandbox.close()


async def test_a_setup_past_its_deadline_is_a_sandbox_error_and_leaks_nothing(
    provider: LocalProvider, monkeypatch
) -> None:
    async def never(channel: Channel) -> tuple[int, int, bytes]:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    monkeypatch.setattr(Channel, "next_setup_message", never)
    monkeypatch.setattr("reinforge.sandbox.local_sandbox.SETUP_TIMEOUT_S", 1.0)
    before = set(provider.live)
    with pytest.raises(SandboxError, match=r"^sandbox \S+ was not set up within 1 s$"):
        await provider.create()
    assert set(provider.live) == before


async def test_lifetime_closes_the_sandbox(provider: LocalProvider) -> None:
    sandbox = await provider.create(SandboxSpec(lifetime_s=0.2))
    for _ in range(300):
        if sandbox.id not in provider.live:
            break
        await asyncio.sleep(0.01)
    with pytest.raises(SandboxClosed):
        await sandbox.exec("true")


@needs_python3
async def test_without_cgroups_limits_fall_back_to_rlimits(tmp_path) -> None:
    provider = LocalProvider(use_cgroups=False, state_dir=tmp_path / "state")
    caps = provider.capabilities
    assert not caps.memory_limit and not caps.pause_exact and caps.notes
    async with await provider.create(SandboxSpec(memory_bytes=64 << 20)) as sandbox:
        bomb = await sandbox.exec(["python3", "-c", "bytearray(200 << 20)"])
        assert bomb.exit_code != 0 and b"MemoryError" in bomb.stderr
        # best-effort pause: SIGSTOP reaches even a setsid'd process
        await sandbox.exec("setsid sleep 1000 &")
        await sandbox.pause()
        states = [
            open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0]
            for p in pid_namespace_members(sandbox.init_pid)
        ]
        assert states and set(states) == {"T"}
        await sandbox.resume()
        assert (await sandbox.exec("echo ok")).stdout == b"ok\n"
    await provider.aclose()


async def test_seccomp_denies_new_namespaces(provider: LocalProvider) -> None:
    probe = "unshare --user true && echo allowed"
    async with await provider.create(SandboxSpec(seccomp=True)) as hardened:
        result = await hardened.exec(probe)
        assert result.exit_code != 0 and b"Operation not permitted" in result.stderr
        assert (await hardened.exec("echo still-works")).stdout == b"still-works\n"
    async with await provider.create() as plain:
        assert (await plain.exec(probe)).stdout == b"allowed\n"


async def test_host_sees_only_the_sandbox_processes(sandbox: LocalSandbox) -> None:
    await sandbox.exec("sleep 1000 & sleep 1000 &")
    members = pid_namespace_members(sandbox.init_pid)
    assert sandbox.init_pid in members and len(members) == 3
    assert os.getpid() not in members


async def test_custom_workdir_is_writable_and_read_only_ones_are_refused(
    provider: LocalProvider,
) -> None:
    async with await provider.create(SandboxSpec(workdir="/app/src")) as sandbox:
        result = await sandbox.exec("pwd && touch made && ls")
        assert result.stdout == b"/app/src\nmade\n"
    with pytest.raises(SandboxError, match="read-only host view"):
        await provider.create(SandboxSpec(workdir="/usr/src"))
    async with await provider.create() as sandbox:
        missing = await sandbox.exec("true", cwd="/nope")
        assert missing.exit_code == 127 and b"cwd /nope" in missing.stderr
