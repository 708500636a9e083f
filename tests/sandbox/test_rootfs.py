"""Rootfs base: a shared, never-modified root directory with a private writable overlay."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from reinforge.sandbox import LocalProvider, Rootfs, SandboxSpec
from reinforge.sandbox.rootfs import import_tarball

TOOLS = ("sh", "cat", "ls", "mkdir", "echo", "tar")


def tiny_rootfs_tar(path: Path) -> None:
    """A rootfs tarball holding a few host binaries and the libraries they load."""
    binaries = [Path(shutil.which(tool) or "").resolve() for tool in TOOLS]
    libraries: set[Path] = set()
    for binary in binaries:
        ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
        for line in ldd.splitlines():
            for word in line.split():
                if word.startswith("/"):
                    libraries.add(Path(word))
    with tarfile.open(path, "w") as tar:
        for directory, mode in (("bin", 0o755), ("etc", 0o755), ("tmp", 0o1777)):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        for tool, binary in zip(TOOLS, binaries, strict=True):
            tar.add(binary, arcname=f"bin/{tool}")
        for library in libraries:
            tar.add(library.resolve(), arcname=str(library).lstrip("/"))
        passwd = b"root:x:0:0:root:/root:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        tar.addfile(info, io.BytesIO(passwd))


@pytest.fixture(scope="module")
def tiny_rootfs(tmp_path_factory) -> Rootfs:
    if shutil.which("ldd") is None:
        pytest.skip("needs ldd to collect the libraries of the test rootfs")
    work = tmp_path_factory.mktemp("rootfs")
    tiny_rootfs_tar(work / "rootfs.tar")
    return import_tarball(work / "rootfs.tar", work / "root")


def test_import_shifts_owners_into_the_sandbox_range(tiny_rootfs: Rootfs) -> None:
    expected = 100_000 if os.geteuid() == 0 else os.getuid()
    assert (tiny_rootfs.path / "etc" / "passwd").stat().st_uid == expected


async def test_rootfs_sandbox_writes_to_its_overlay_only(
    provider: LocalProvider, tiny_rootfs: Rootfs
) -> None:
    spec = SandboxSpec(base=tiny_rootfs)
    async with await provider.create(spec) as a, await provider.create(spec) as b:
        result = await a.exec("echo changed > /etc/passwd && echo new > /etc/new && cat /etc/new")
        assert result.exit_code == 0 and result.stdout == b"new\n", result.stderr
        assert (
            sorted((await a.exec("ls /")).stdout.split())
            == [b"bin", b"dev", b"etc", b"lib", b"lib64", b"proc", b"tmp", b"workspace"]
            or b"usr" in (await a.exec("ls /")).stdout
        )
        assert (await b.exec("cat /etc/passwd")).stdout.startswith(b"root:")  # b unaffected
    assert (tiny_rootfs.path / "etc" / "passwd").read_bytes().startswith(b"root:")
    assert not (tiny_rootfs.path / "etc" / "new").exists()


async def test_rootfs_disk_budget_covers_the_whole_overlay(
    provider: LocalProvider, tiny_rootfs: Rootfs
) -> None:
    spec = SandboxSpec(base=tiny_rootfs, disk_bytes=8 << 20)
    async with await provider.create(spec) as sandbox:
        await sandbox.write_files({"/tmp/a": b"x" * (4 << 20)})
        with pytest.raises(Exception, match="No space left"):
            await sandbox.write_files({"/etc/b": b"x" * (6 << 20)})
