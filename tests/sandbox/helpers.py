"""Helpers shared by the sandbox tests (imported by the test modules, not fixtures)."""

from __future__ import annotations

import io
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from reinforge.sandbox import LocalSandbox
from reinforge.sandbox.reaper import pid_namespace_members


def userns_skip_reason() -> str | None:
    if sys.platform != "linux":
        return "local sandboxes need Linux"
    if shutil.which("unshare") is None:
        return None  # cannot pre-check; let the sandbox itself report
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True)
    if probe.returncode != 0:
        return f"user namespaces unavailable: {probe.stderr.decode().strip()}"
    return None


# Probes inside the sandbox use the host's python3 (visible through the read-only view).
needs_python3 = pytest.mark.skipif(
    not any(Path(d, "python3").exists() for d in ("/usr/local/bin", "/usr/bin", "/bin")),
    reason="no python3 in the host's /usr or /bin for the in-sandbox probes",
)


def host_pid_alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie (a zombie has already released everything)."""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def make_tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def namespace_cpu_ticks(sandbox: LocalSandbox) -> int:
    """CPU time (utime + stime, clock ticks) of every process in the sandbox now."""
    total = 0
    for pid in pid_namespace_members(sandbox.init_pid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        total += int(fields[11]) + int(fields[12])
    return total


FILL_PIDS_PROGRAM = """
import os, time
full = False
while True:
    try:
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
    except OSError:
        if not full:
            open("/tmp/pids-full", "w").close()
            full = True
"""
FILL_PIDS = (
    f"python3 -c {shlex.quote(FILL_PIDS_PROGRAM)} >/dev/null 2>&1 & "
    "while [ ! -e /tmp/pids-full ]; do :; done"
)
"""Shell that leaves a program running that keeps its sandbox's pids limit full, and ends
once the limit is full: each pid that frees is taken again at once, and the program
never exits for a failed fork (a shell may)."""
