"""`SandboxSpec.writable_dirs`: directories besides the workdir that a verifier needs
(a Harbor task's /tests and /logs) while the rest of the root stays read-only."""

from __future__ import annotations

import pytest

from reinforge.sandbox import LocalProvider, SandboxSpec
from reinforge.sandbox.docker import run_args
from reinforge.sandbox.protocol import SandboxError


async def test_extra_writable_dirs_exist_and_the_rest_stays_read_only(provider: LocalProvider):
    spec = SandboxSpec(workdir="/app", writable_dirs=("/tests", "/logs/verifier"))
    async with await provider.create(spec) as sandbox:
        ok = await sandbox.exec("touch /app/a /tests/b /logs/verifier/c /logs/d && pwd")
        assert ok.exit_code == 0 and ok.stdout == b"/app\n", ok.stderr
        denied = await sandbox.exec("touch /elsewhere")
        assert denied.exit_code == 1 and b"Read-only file system" in denied.stderr


async def test_a_writable_dir_inside_the_host_view_is_refused(provider: LocalProvider):
    with pytest.raises(SandboxError, match="inside the read-only host view"):
        await provider.create(SandboxSpec(writable_dirs=("/usr/local/evil",)))


def test_docker_gets_a_tmpfs_for_each():
    args = run_args(SandboxSpec(writable_dirs=("/tests", "/tmp")), "img", "n", "o")
    mounts = [args[i + 1] for i, a in enumerate(args) if a == "--tmpfs"]
    assert any(m.startswith("/tests:rw") for m in mounts)
    assert sum(m.startswith("/tmp:") for m in mounts) == 1


async def test_an_own_disk_keeps_room_when_the_shared_disk_is_full(provider: LocalProvider):
    spec = SandboxSpec(
        workdir="/app",
        writable_dirs=("/tests",),
        disk_bytes=8 << 20,
        own_disks={"/logs/v": 1 << 20},
    )
    async with await provider.create(spec) as sandbox:
        full = await sandbox.exec("dd if=/dev/zero of=/tmp/fill bs=1M; echo 0 > /logs/v/reward")
        assert b"No space left" in full.stderr and full.exit_code == 0, full.stderr
        assert await sandbox.read_files(["/logs/v/reward"]) == {"/logs/v/reward": b"0\n"}
        # Its own size, not the shared one; and root inside cannot take it away.
        over = await sandbox.exec("dd if=/dev/zero of=/logs/v/big bs=1M count=2")
        assert b"No space left" in over.stderr
        for move in ("umount /logs/v", "rm -rf /logs/v", "mv /logs/v /logs/w", "touch /logs/x"):
            assert (await sandbox.exec(move)).exit_code != 0, move
        mounted = await sandbox.exec("grep -c ' /logs/v ' /proc/self/mountinfo")
        assert mounted.stdout == b"1\n"


def test_docker_gives_an_own_disk_its_own_size():
    args = run_args(SandboxSpec(own_disks={"/logs/verifier": 1 << 20}), "img", "n", "o")
    assert "/logs/verifier:rw,size=1048576,mode=755" in args
