"""Docker backend: the same `Sandbox` API on a Docker engine, via the `docker` CLI.

For machines that already run Docker (no new Python dependency). The image is the base
(the provider's, or a spec's `Image`, such as one `build` made from a Harbor task's
Dockerfile) and is mounted read-only like the local HostView; the workdir, /workspace,
/tmp, /root, /var/tmp and the spec's writable dirs are size-capped tmpfs mounts (each gets
`disk_bytes`, unlike the local backend's single budget) that start with what the image
holds there. Network "off" is `--network none`; "on" is Docker's default bridge. The
image needs `sh` and `tar`. Containers carry the manager's owner tag as a label, so a later
run removes those of a crashed one, as the local backend does with its state directory.

The container's pid 1 is `sleep` itself, not an init: killing every other process (a
Harbor task's agent phase ends so) must leave the container running. Orphans therefore
stay zombies until the container is removed; they hold a pid each, nothing else.
"""

from __future__ import annotations

import asyncio
import atexit
import io
import itertools
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

from reinforge.sandbox import reaper
from reinforge.sandbox.protocol import (
    MIB,
    TIMEOUT_EXIT_CODE,
    Capabilities,
    ExecResult,
    Image,
    OutputCallback,
    Rootfs,
    SandboxClosed,
    SandboxError,
    SandboxSpec,
    TarTooLarge,
)

LABEL = "reinforge.sandbox.owner"
_NAMES = itertools.count()
"""Container numbers, shared by every provider of the process (their names must differ)."""
WRITABLE_DIRS = {"/workspace": "755", "/tmp": "1777", "/root": "700", "/var/tmp": "1777"}


def writable_dirs(spec: SandboxSpec) -> dict[str, str]:
    """Each tmpfs of `disk_bytes` a container gets, with its mode."""
    dirs = {spec.workdir: "755"} | WRITABLE_DIRS
    return dirs | {path: "755" for path in spec.writable_dirs if path not in dirs}


def run_args(spec: SandboxSpec, image: str, name: str, owner: str) -> list[str]:
    """The `docker run` arguments that give a container from `image` the limits of `spec`."""
    if isinstance(spec.base, Rootfs):
        raise SandboxError("the Docker backend takes its base from the image, not a Rootfs")
    args = [
        "run",
        "--detach",
        "--name",
        name,
        "--label",
        f"{LABEL}={owner}",
        "--hostname",
        spec.hostname,
        "--read-only",
        "--workdir",
        spec.workdir,
        "--network",
        "none" if spec.network == "off" else "bridge",
        "--security-opt",
        "no-new-privileges",
        "--ulimit",
        f"nofile={spec.open_files}:{spec.open_files}",
        "--ulimit",
        "core=0",
    ]
    for path, mode in writable_dirs(spec).items():
        args += ["--tmpfs", f"{path}:rw,size={spec.disk_bytes},mode={mode}"]
    for path, size in spec.own_disks.items():
        args += ["--tmpfs", f"{path}:rw,size={size},mode=755"]
    if spec.memory_bytes is not None:
        args += ["--memory", f"{spec.memory_bytes}b", "--memory-swap", f"{spec.memory_bytes}b"]
    if spec.pids is not None:
        args += ["--pids-limit", str(spec.pids)]
    if spec.cpus is not None:
        args += ["--cpus", f"{spec.cpus:g}"]
    if spec.file_size_bytes is not None:
        args += ["--ulimit", f"fsize={spec.file_size_bytes}"]
    for key, value in spec.env.items():
        args += ["--env", f"{key}={value}"]
    return args + [image, "sleep", "infinity"]


async def _docker(
    docker: str, *args: str, stdin: bytes | None = None, check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    proc = await asyncio.create_subprocess_exec(
        docker,
        *args,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await proc.communicate(stdin)
    done = subprocess.CompletedProcess([docker, *args], proc.returncode or 0, out, err)
    if check and done.returncode != 0:
        raise SandboxError(f"docker {args[0]} failed: {err.decode(errors='replace').strip()}")
    return done


class DockerSandbox:
    """One container. Commands run through `docker exec`; timeouts kill inside it."""

    capabilities = Capabilities(
        pause=True,
        pause_exact=True,
        fs_snapshot=False,
        memory_snapshot=False,
        network_modes=frozenset({"off", "on"}),
        memory_limit=True,
        pids_limit=True,
        cpu_limit=True,
        notes=("each writable directory has its own disk_bytes tmpfs",),
    )

    def __init__(self, provider: DockerProvider, container: str, spec: SandboxSpec) -> None:
        self.id = container
        self.spec = spec
        self._provider = provider
        self._docker = provider.docker
        self._ids = itertools.count(1)
        self._closed = False

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
    ) -> ExecResult:
        if self._closed:
            raise SandboxClosed(f"sandbox {self.id} is closed")
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        pidfile = f"/tmp/.reinforge-exec-{next(self._ids)}"
        # Record the command's pid so a timeout can kill it *inside* the container:
        # killing the `docker exec` client would leave the command running.
        wrapped = ["/bin/sh", "-c", f'echo $$ > {pidfile}; exec "$@"', "sh", *argv]
        args = [
            "exec",
            "--interactive",
            "--workdir",
            cwd or self.spec.workdir,
        ]
        for key, value in (env or {}).items():
            args += ["--env", f"{key}={value}"]
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            self._docker,
            *args,
            self.id,
            *wrapped,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        if stdin:
            proc.stdin.write(stdin)
        proc.stdin.close()
        collect = [
            _collect(proc.stdout, max_output_bytes, on_output, "stdout"),
            _collect(proc.stderr, max_output_bytes, on_output, "stderr"),
        ]
        readers = asyncio.ensure_future(asyncio.gather(*collect))
        timed_out = False
        kill = ("exec", self.id, "sh", "-c", f"kill -9 $(cat {pidfile})")
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            timed_out = True
            await _docker(self._docker, *kill, check=False)
            await proc.wait()
        except asyncio.CancelledError:
            # A caller that gives up (a tool's own time limit) must not leave the command
            # running in the container, where the `docker exec` client cannot reach it.
            await asyncio.shield(_docker(self._docker, *kill, check=False))
            readers.cancel()
            raise
        (out, out_cut), (err, err_cut) = await readers
        return ExecResult(
            exit_code=TIMEOUT_EXIT_CODE if timed_out else _exit_code(proc.returncode),
            stdout=out,
            stderr=err,
            duration=time.monotonic() - started,
            timed_out=timed_out,
            truncated=out_cut or err_cut,
        )

    async def write_files(self, files: Mapping[str, bytes], *, mode: int = 0o644) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for path, data in files.items():
                info = tarfile.TarInfo(self._absolute(path).lstrip("/"))
                info.size, info.mode = len(data), mode
                tar.addfile(info, io.BytesIO(data))
        await self.upload_tar(buf.getvalue(), "/")

    async def read_files(
        self, paths: Sequence[str], *, max_bytes: int = MIB
    ) -> dict[str, bytes | None]:
        found: dict[str, bytes | None] = {}
        # Regular files only, as the local backend: opening a FIFO waits for a writer.
        script = 'test -f "$1" && exec head -c "$2" -- "$1"'
        for path in paths:
            result = await self.exec(
                ["/bin/sh", "-c", script, "sh", self._absolute(path), str(max_bytes)],
                max_output_bytes=max_bytes,
            )
            found[path] = result.stdout if result.exit_code == 0 else None
        return found

    async def upload_tar(self, tar_bytes: bytes, dest: str) -> None:
        script = 'mkdir -p "$1" && exec tar -x --no-same-owner -C "$1"'
        result = await self.exec(
            ["/bin/sh", "-c", script, "sh", self._absolute(dest)], stdin=tar_bytes
        )
        if result.exit_code != 0:
            raise SandboxError(f"upload_tar failed: {result.stderr.decode(errors='replace')}")

    async def download_tar(self, src: str, *, max_bytes: int = 1 << 30) -> bytes:
        path = self._absolute(src)
        parent, name = os.path.split(path.rstrip("/"))
        result = await self.exec(
            ["tar", "-c", "-C", parent or "/", name], max_output_bytes=max_bytes
        )
        if result.truncated:
            raise TarTooLarge(f"download_tar of {src}: larger than {max_bytes} bytes")
        if result.exit_code != 0:
            raise SandboxError(f"download_tar failed: {result.stderr.decode(errors='replace')}")
        return result.stdout

    def _absolute(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.spec.workdir}/{path}"

    async def pause(self) -> None:
        await _docker(self._docker, "pause", self.id, check=False)

    async def resume(self) -> None:
        await _docker(self._docker, "unpause", self.id, check=False)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.shield(_docker(self._docker, "rm", "--force", self.id, check=False))
        self._provider.live.discard(self.id)

    async def __aenter__(self) -> DockerSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _collect(
    stream: asyncio.StreamReader, cap: int, on_output: OutputCallback | None, name: str
) -> tuple[bytes, bool]:
    chunks, size, truncated = [], 0, False
    while chunk := await stream.read(256 * 1024):
        if on_output is not None:
            on_output(name, chunk)
        keep = chunk[: max(0, cap - size)]
        truncated |= len(keep) < len(chunk)
        chunks.append(keep)
        size += len(keep)
    return b"".join(chunks), truncated


def _exit_code(returncode: int | None) -> int:
    code = returncode or 0
    return 128 - code if code < 0 else code


class DockerProvider:
    """Creates containers from `image`. Call `reap()` once to remove a crashed run's ones."""

    def __init__(self, image: str = "debian:bookworm-slim", *, docker: str = "docker") -> None:
        resolved = shutil.which(docker)
        if resolved is None:
            raise SandboxError(f"no `{docker}` executable on PATH")
        self.docker = resolved
        self.image = image
        self.owner = reaper.owner_tag(os.getpid())
        self.live: set[str] = set()
        self._seeds: dict[tuple[str, str], bytes | None] = {}
        self._seeding = asyncio.Lock()
        atexit.register(self.close_all_sync)

    async def reap(self) -> int:
        stale = await self.stale()
        if stale:
            await _docker(self.docker, "rm", "--force", *stale, check=False)
        return len(stale)

    async def stale(self) -> list[str]:
        """The containers of sandbox managers that have exited: what a crashed run left."""
        listed = await _docker(
            self.docker,
            "ps",
            "--all",
            "--filter",
            f"label={LABEL}",
            "--format",
            f'{{{{.ID}}}} {{{{.Label "{LABEL}"}}}}',
        )
        rows = [line.split() for line in listed.stdout.decode().splitlines()]
        return [row[0] for row in rows if len(row) == 2 and not reaper.owner_alive(row[1])]

    async def create(self, spec: SandboxSpec | None = None) -> DockerSandbox:
        spec = spec or SandboxSpec()
        name = f"reinforge-{self.owner}-{next(_NAMES)}"
        image = spec.base.name if isinstance(spec.base, Image) else self.image
        self.live.add(name)
        try:
            await _docker(self.docker, *run_args(spec, image, name, self.owner))
            for path, seed in (await self._seeds_of(image, list(writable_dirs(spec)))).items():
                # As root, so the image's owners and modes are kept.
                extract = ("exec", "--interactive", "--user", "0", name, "tar", "-x", "-C")
                await _docker(self.docker, *extract, str(PurePosixPath(path).parent), stdin=seed)
        except BaseException:
            await asyncio.shield(_docker(self.docker, "rm", "--force", name, check=False))
            self.live.discard(name)
            raise
        return DockerSandbox(self, name, spec)

    async def _seeds_of(self, image: str, paths: list[str]) -> dict[str, bytes]:
        """What `image` holds at each of `paths` that holds anything, as a tar (top entry:
        the path's basename): a tmpfs mounted there would hide it. Read once per image."""
        async with self._seeding:
            missing = [path for path in paths if (image, path) not in self._seeds]
            if missing:
                made = await _docker(self.docker, "create", image, "true")
                container = made.stdout.decode().strip()
                try:
                    for path in missing:
                        source = f"{container}:{path}"
                        copied = await _docker(self.docker, "cp", source, "-", check=False)
                        self._seeds[(image, path)] = copied.stdout if _has_entries(copied) else None
                finally:
                    await _docker(self.docker, "rm", "--force", container, check=False)
        seeds = {path: self._seeds[(image, path)] for path in paths}
        return {path: seed for path, seed in seeds.items() if seed is not None}

    def close_all_sync(self) -> None:
        if self.live:
            subprocess.run([self.docker, "rm", "--force", *self.live], capture_output=True)
            self.live.clear()

    async def aclose(self) -> None:
        if self.live:
            await _docker(self.docker, "rm", "--force", *self.live, check=False)
            self.live.clear()
        atexit.unregister(self.close_all_sync)


def _has_entries(copied: subprocess.CompletedProcess[bytes]) -> bool:
    """Whether `docker cp ... -` gave a tar of a directory that holds anything."""
    if copied.returncode != 0:
        return False
    with tarfile.open(fileobj=io.BytesIO(copied.stdout)) as tar:
        return len(tar.getmembers()) > 1
