"""Base root filesystems for tasks that need their own system packages, without Docker.

`build_rootfs` runs mmdebstrap (apt only, ~24 s for a minbase + python3 + git measured)
and unpacks the result with owners shifted into the sandbox uid range: in a user
namespace, overlayfs can copy up only files whose owner is mapped. Results are cached by
suite and package list, so a task family pays the build once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from reinforge.sandbox.protocol import Rootfs, SandboxError

DEFAULT_UID_BASE = 100_000  # LocalProvider's default uid_base
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "reinforge/rootfs"


def _uid_shift() -> int:
    return DEFAULT_UID_BASE if os.geteuid() == 0 else 0


def import_tarball(tarball: Path, dest: Path, *, uid_shift: int | None = None) -> Rootfs:
    """Unpack a (trusted) rootfs tarball into `dest`, shifting owners by `uid_shift`.

    The default shift matches `LocalProvider()`: +100000 as root, none otherwise (a
    non-root manager maps only its own uid, which already owns what it unpacks).
    """
    shift = _uid_shift() if uid_shift is None else uid_shift
    as_root = os.geteuid() == 0

    def shifted(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
        if member.isdev() and not as_root:
            return None  # type: ignore[return-value]  # skip: only root may mknod
        return member.replace(uid=member.uid + shift, gid=member.gid + shift, deep=False)

    dest.mkdir(parents=True, exist_ok=False)
    with tarfile.open(tarball) as tar:
        tar.extractall(dest, numeric_owner=True, filter=shifted)
    if as_root:
        os.chown(dest, shift, shift)
    return Rootfs(dest)


def build_rootfs(
    packages: Sequence[str] = ("python3",),
    *,
    suite: str = "bookworm",
    mirror: str | None = None,
    cache_dir: Path = DEFAULT_CACHE,
) -> Rootfs:
    """A Debian `suite` minbase root with `packages`, built once and then reused."""
    key = hashlib.sha256(f"{suite}|{mirror}|{sorted(packages)}|{_uid_shift()}".encode())
    dest = cache_dir / f"{suite}-{key.hexdigest()[:16]}"
    marker = cache_dir / f"{dest.name}.complete"  # outside the tree: not visible inside
    if marker.exists():
        return Rootfs(dest)
    if shutil.which("mmdebstrap") is None:
        raise SandboxError("build_rootfs needs mmdebstrap (apt-get install mmdebstrap)")
    shutil.rmtree(dest, ignore_errors=True)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        command = [
            "mmdebstrap",
            "--variant=minbase",
            f"--include={','.join(packages)}",
            suite,
            str(tarball),
        ] + ([mirror] if mirror else [])
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SandboxError(f"mmdebstrap failed: {done.stderr.strip()[-2000:]}")
        import_tarball(tarball, dest)
    marker.touch()
    return Rootfs(dest)
