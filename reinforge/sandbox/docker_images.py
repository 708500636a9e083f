"""The Docker engine and its images, for the Docker backend (`docker.py`): whether an
engine answers, and the image of a task, built from its Dockerfile or pulled prebuilt, with
what a sandbox from it needs to know (its workdir, ENV and the files it holds there)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from reinforge.sandbox.protocol import SandboxError


def unreachable(docker: str = "docker") -> str | None:
    """None if a Docker engine answers through the `docker` CLI, else why not (one line)."""
    resolved = shutil.which(docker)
    if resolved is None:
        return f"no `{docker}` executable on PATH"
    try:
        done = subprocess.run(
            [resolved, "info", "--format", "{{.ServerVersion}}"], capture_output=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 30 s"
    if done.returncode == 0:
        return None
    lines = done.stderr.decode(errors="replace").strip().splitlines() or ["`docker info` failed"]
    return lines[0]


@dataclass(frozen=True)
class BuiltImage:
    """An image `build_image` made, with what a sandbox from it needs to know."""

    name: str
    workdir: str
    """The sandboxes' workdir: the one asked for, else the image's WORKDIR, else
    `default_workdir`."""
    env: dict[str, str]
    """The image's ENV."""
    files: frozenset[str]
    """Absolute paths of the regular files the image holds in its workdir."""


def build_image(
    context: Path,
    tag: str,
    default_workdir: str,
    docker: str = "docker",
    *,
    workdir: str | None = None,
) -> BuiltImage:
    """The image of `context/Dockerfile`, tagged `tag`. A tag that exists is used as it is,
    so name it after the context's contents. A failed build raises SandboxError with the end
    of Docker's log. `workdir`, where given, is the sandboxes' over the image's WORKDIR."""
    if _run(docker, "image", "inspect", tag).returncode != 0:
        _check(_run(docker, "build", "--tag", tag, str(context)), f"docker build of {context}")
    return _inspected(tag, default_workdir, docker, workdir)


def pulled_image(
    tag: str, default_workdir: str, docker: str = "docker", *, workdir: str | None = None
) -> BuiltImage:
    """A prebuilt image, pulled where the engine lacks it; as `build_image` gives one."""
    if _run(docker, "image", "inspect", tag).returncode != 0:
        _check(_run(docker, "pull", tag), f"docker pull of {tag}")
    return _inspected(tag, default_workdir, docker, workdir)


def _check(done: subprocess.CompletedProcess[bytes], what: str) -> None:
    """SandboxError with the end of Docker's log, where `done` failed."""
    if done.returncode != 0:
        log = (done.stdout + done.stderr).decode(errors="replace").strip().splitlines()
        raise SandboxError(f"{what} failed: " + " | ".join(log[-6:]))


def _inspected(tag: str, default_workdir: str, docker: str, workdir: str | None) -> BuiltImage:
    config = json.loads(
        _run(docker, "image", "inspect", "--format", "{{json .Config}}", tag).stdout
    )
    workdir = workdir or config.get("WorkingDir") or default_workdir
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    container = _run(docker, "create", tag, "true").stdout.decode().strip()
    try:
        copied = _run(docker, "cp", f"{container}:{workdir}", "-")
    finally:
        _run(docker, "rm", "--force", container)
    parent = PurePosixPath(workdir).parent
    files: set[str] = set()
    if copied.returncode == 0:
        with tarfile.open(fileobj=io.BytesIO(copied.stdout)) as tar:
            files = {str(parent / m.name) for m in tar.getmembers() if m.isfile()}
    return BuiltImage(tag, workdir, env, frozenset(files))


def _run(docker: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([docker, *args], capture_output=True)
