"""The sandbox vocabulary every backend speaks: one isolated computer per rollout.

A backend (local namespaces, Docker, a hosted provider) implements `SandboxProvider` and
`Sandbox`; callers (tools, graders, the pool) only ever see these types, so a rollout
moves between backends by changing the provider object and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

NetworkMode = Literal["off", "on"]
OutputCallback = Callable[[str, bytes], None]  # ("stdout" | "stderr", chunk), as it arrives

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TIMEOUT_EXIT_CODE = 124  # what coreutils `timeout` returns; callers already know it
MIB = 1 << 20


class SandboxError(RuntimeError):
    """A sandbox could not be created or stopped working (its init died, setup failed)."""


class SandboxClosed(SandboxError):
    """An operation was attempted on a sandbox that was already closed."""


class SandboxPaused(SandboxError):
    """An operation needs the sandbox running; resume it first (the pool does this for you)."""


class TarTooLarge(SandboxError):
    """`download_tar` met its `max_bytes`: what the sandbox holds, not the sandbox, is at
    fault (a sparse file counts at its full size)."""


@dataclass(frozen=True)
class HostView:
    """Base filesystem = the host's system directories, bind-mounted read-only.

    The fast default: nothing to build or copy. Only `dirs` are visible; everything
    else on the host (home directories, the project, other sandboxes) does not exist
    inside. Tools the task needs must therefore be installed on the host.
    """

    dirs: tuple[str, ...] = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")


@dataclass(frozen=True)
class Rootfs:
    """Base filesystem = a root directory (e.g. from `build_rootfs`), shared read-only.

    Writes land in a private, size-capped overlay upper layer, so the directory itself is
    never modified and many sandboxes share it. With a root manager its files must be
    owned by the mapped uid range (`rootfs.import_tarball` shifts them).
    """

    path: Path


@dataclass(frozen=True)
class Image:
    """Base filesystem = a container image (the Docker backend only), read-only like the
    others. Each writable directory starts with what the image holds there, so a task
    image built with RUN steps keeps its files in the workdir."""

    name: str


@dataclass(frozen=True)
class SandboxSpec:
    """What one sandbox gets. Limits are per sandbox; `None` means "no limit of this kind"."""

    base: HostView | Rootfs | Image = field(default_factory=HostView)
    disk_bytes: int = 512 * MIB  # writable workspace, /tmp and /root together (tmpfs)
    memory_bytes: int | None = 1024 * MIB  # includes tmpfs pages where cgroups allow
    pids: int | None = 256
    cpus: float | None = 1.0
    file_size_bytes: int | None = None  # RLIMIT_FSIZE of every process
    open_files: int = 1024
    network: NetworkMode = "off"
    lifetime_s: float | None = None  # closed automatically after this many seconds
    workdir: str = "/workspace"
    writable_dirs: tuple[str, ...] = ()
    """More writable directories besides the workdir, in the same `disk_bytes` budget: a
    Harbor task's verifier needs `/tests` beside its workdir."""
    own_disks: Mapping[str, int] = field(default_factory=dict)
    """Writable directories with a disk of their own: a tmpfs of this many bytes each,
    outside `disk_bytes`, so filling the shared disk leaves them room. A Harbor verifier's
    `/logs/verifier` is one: a candidate that fills the disk cannot stop `test.sh` from
    writing its reward."""
    env: Mapping[str, str] = field(default_factory=dict)
    hostname: str = "sandbox"
    seccomp: bool = False  # deny-list of kernel-attack-surface syscalls (see docs)


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one command. `exit_code` is 128+N when killed by signal N, 124 on timeout."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    duration: float
    timed_out: bool = False
    truncated: bool = False  # stdout or stderr went past max_output_bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class Capabilities:
    """What a backend can actually guarantee on this machine (they differ by host)."""

    pause: bool
    pause_exact: bool  # True: every process is frozen (cgroup). False: best-effort SIGSTOP
    fs_snapshot: bool
    memory_snapshot: bool
    network_modes: frozenset[str]
    memory_limit: bool  # limit covers the whole sandbox (cgroup), not one process (rlimit)
    pids_limit: bool  # per-sandbox pids limit (cgroup), not per-uid RLIMIT_NPROC
    cpu_limit: bool
    notes: tuple[str, ...] = ()  # human-readable reduced guarantees, shown by the CLI


@runtime_checkable
class Sandbox(Protocol):
    """One isolated computer. All methods are coroutines; `close` is idempotent."""

    id: str
    capabilities: Capabilities

    async def exec(
        self,
        cmd: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        max_output_bytes: int = MIB,
        on_output: OutputCallback | None = None,
    ) -> ExecResult: ...

    async def write_files(self, files: Mapping[str, bytes], *, mode: int = 0o644) -> None: ...

    async def read_files(
        self, paths: Sequence[str], *, max_bytes: int = MIB
    ) -> dict[str, bytes | None]: ...

    async def upload_tar(self, tar_bytes: bytes, dest: str) -> None: ...

    async def download_tar(self, src: str, *, max_bytes: int = 1 << 30) -> bytes: ...

    async def pause(self) -> None: ...

    async def resume(self) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class SandboxProvider(Protocol):
    """Creates sandboxes. Hosted providers (E2B, Daytona, Modal) plug in as adapters."""

    async def create(self, spec: SandboxSpec) -> Sandbox: ...

    async def aclose(self) -> None: ...
