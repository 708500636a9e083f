"""Reading Harbor task directories (the Harbor / Terminal-Bench task format).

A task is a directory: `instruction.md` (what the agent is told), `task.toml` (timeouts and
resources), `environment/` (a Dockerfile and its build context), `solution/solve.sh` (the
reference, run by the oracle agent) and `tests/test.sh` (the verifier, which writes
`/logs/verifier/reward.txt` or `reward.json`). `task.toml` is read as Harbor's own task
model reads it (`task_config.py`).

On the local backend there is no image build: a Dockerfile made only of FROM (the host's
system stands in for the named image), WORKDIR, COPY/ADD of local files and ENV is
replayed onto a fresh sandbox. Any other instruction needs Docker: `build_image` makes the
task's image on a Docker engine (tagged with a hash of `environment/`, so an unchanged
task is built once), and where none is reachable the task is skipped with a one-line
reason.

A git repository the environment copies (a `.git` directory or a bare repository) reaches
the sandbox with its base commit only (`add_base_commit`): its history may hold the
solution. A git bundle, which is history in one file, is refused.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import subprocess
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from pydantic import ValidationError

from reinforge.envs.harbor.task_config import TaskConfig, resolve_env
from reinforge.errors import UsageError
from reinforge.sandbox.docker_images import BuiltImage, build_image, pulled_image

DEFAULT_WORKDIR = "/app"
"""Where the agent works when the Dockerfile sets no WORKDIR (Docker's own default, `/`,
cannot be a sandbox workdir)."""
LOCAL_INSTRUCTIONS = frozenset({"FROM", "WORKDIR", "COPY", "ADD", "ENV"})
WRITABLE_TOPS = ("tmp", "root", "var")
"""Top-level directories the local host view always makes writable (besides the workdir)."""
CANARY_LINE = re.compile(r"(<!--.*canary.*-->|#.*canary.*)", re.IGNORECASE)
GIT_DIR = ".git"
GIT_CONFIG_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
"""git rebuilding a task's repository on the host reads no system or user config: the
result must not depend on the host's."""


@dataclass(frozen=True)
class Copy:
    """One COPY/ADD: files of the build context and where they land in the sandbox."""

    sources: tuple[str, ...]
    dest: str
    workdir: str
    """The WORKDIR in force at this line (a relative `dest` is below it)."""


@dataclass
class ImagePlan:
    """The Dockerfile as steps a fresh local sandbox can replay, or why it cannot."""

    base: str = ""
    workdir: str = DEFAULT_WORKDIR
    env: dict[str, str] = field(default_factory=dict)
    copies: list[Copy] = field(default_factory=list)
    needs_docker: str | None = None
    """Why this image cannot be replayed without Docker (None: it can)."""


@dataclass
class HarborTask:
    """One task directory, read and checked."""

    path: Path
    name: str
    instruction: str
    config: TaskConfig
    plan: ImagePlan
    image: BuiltImage | None = None
    """The task's image on Docker, once `build` made it (tasks that need Docker)."""

    @property
    def workdir(self) -> str:
        return self.image.workdir if self.image else self.plan.workdir

    @property
    def env(self) -> dict[str, str]:
        """The image's ENV, and the task's `[environment] env` over it."""
        image = self.image.env if self.image else self.plan.env
        return image | self.config.environment.env

    def build(self, docker: str) -> None:
        """Make the task's image with the `docker` CLI, or pull its prebuilt one
        (SandboxError when that fails)."""
        workdir = self.config.environment.workdir
        prebuilt = self.config.environment.docker_image
        if prebuilt:
            self.image = pulled_image(prebuilt, DEFAULT_WORKDIR, docker, workdir=workdir)
            return
        context = self.path / "environment"
        digest = hashlib.sha256()
        for file in sorted(p for p in context.rglob("*") if p.is_file()):
            digest.update(str(file.relative_to(context)).encode() + b"\0")
            digest.update(hashlib.sha256(file.read_bytes()).digest())
        name = re.sub(r"[^a-z0-9._-]+", "-", self.name.lower()).strip(".-") or "task"
        tag = f"reinforge-harbor/{name}:{digest.hexdigest()[:16]}"
        self.image = build_image(context, tag, DEFAULT_WORKDIR, docker, workdir=workdir)

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"

    def environment_tar(self) -> bytes:
        """The files the Dockerfile copies, as a tar of absolute sandbox paths (rooted at /)."""
        buffer = io.BytesIO()
        context = (self.path / "environment").resolve()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for copy in self.plan.copies:
                for source in copy.sources:
                    _add_copy(tar, context, source, copy)
        return buffer.getvalue()

    def shipped_paths(self) -> set[str]:
        """Absolute sandbox paths of every file the environment puts in place."""
        if self.image is not None:
            return set(self.image.files)
        with tarfile.open(fileobj=io.BytesIO(self.environment_tar())) as tar:
            return {"/" + m.name for m in tar.getmembers() if m.isfile()}


def _add_copy(tar: tarfile.TarFile, context: Path, source: str, copy: Copy) -> None:
    src = (context / source).resolve()
    if not src.is_relative_to(context) or not src.exists():
        raise UsageError(f"COPY {source}: not a file of the build context {context}")
    dest = PurePosixPath(copy.workdir) / copy.dest
    if _is_repository(src):
        add_base_commit(tar, src, dest)
        return
    if src.is_dir():
        repositories: list[Path] = []
        for child in sorted(src.rglob("*")):
            if any(child.is_relative_to(r) for r in repositories):
                continue  # a repository's own files: `add_base_commit` writes new ones
            inside = child.relative_to(src)
            if _is_repository(child):
                repositories.append(child)
                add_base_commit(tar, child, dest / inside)
            elif child.is_file():
                _refuse_bundle(child)
                tar.add(child, arcname=str(dest / inside).lstrip("/"))
        return
    _refuse_bundle(src)
    # Docker: a destination ending in / or . (or several sources) is a directory.
    is_dir = copy.dest.endswith(("/", "/.")) or copy.dest == "." or len(copy.sources) > 1
    target = dest / src.name if is_dir else dest
    tar.add(src, arcname=str(target).lstrip("/"))


def _is_repository(path: Path) -> bool:
    """A `.git` directory, or a bare repository (HEAD, objects/ and refs/ side by side)."""
    if not path.is_dir():
        return False
    bare = (path / "HEAD").is_file() and (path / "objects").is_dir() and (path / "refs").is_dir()
    return path.name == GIT_DIR or bare


def _refuse_bundle(path: Path) -> None:
    with path.open("rb") as file:
        head = file.read(16)
    if head.startswith((b"# v2 git bundle", b"# v3 git bundle")):
        raise UsageError(
            f"{path}: a git bundle carries a repository's history, which may hold the "
            "solution; copy the repository itself (reduced to its base commit) instead"
        )


def add_base_commit(tar: tarfile.TarFile, git_dir: Path, dest: PurePosixPath) -> None:
    """Add, at `dest`, the repository of `git_dir` reduced to its base commit (see
    `base_commit_repository`), in place of its own files."""
    with tempfile.TemporaryDirectory() as tmp:
        new = Path(tmp) / GIT_DIR
        base_commit_repository(git_dir, new)
        tar.add(new, arcname=str(dest).lstrip("/"))


def base_commit_repository(old: Path, new: Path) -> None:
    """Write at `new` a git directory that holds only `old`'s base commit: HEAD's commit
    object and tree, as a shallow root (its parents are not there), HEAD's branch pointing
    at it, an index of its tree and a fresh config. History, the reflog, stashes, tags,
    other refs, packed and dangling objects stay behind: any of them may hold the solution.
    HEAD's hash and tree are unchanged, so `git diff` and `git checkout BASE -- PATH` work
    as before. A bare repository stays bare. A repository whose HEAD has no commit yet
    becomes an empty one."""
    object_format = _git(old, "rev-parse", "--show-object-format").decode().strip()
    _git(new, "init", "-q", "--template=", f"--object-format={object_format}")
    bare = _git(old, "config", "--bool", "core.bare", check=False).strip() == b"true"
    _git(new, "config", "core.bare", "true" if bare else "false")
    branch = _git(old, "symbolic-ref", "-q", "HEAD", check=False).decode().strip()
    if branch:
        _git(new, "symbolic-ref", "HEAD", branch)
    base = _git(old, "rev-parse", "-q", "--verify", "HEAD^{commit}", check=False).decode().strip()
    if not base:
        return
    objects = _git(old, "rev-list", "--objects", "--no-walk", base)
    pack = _git(old, "pack-objects", "--stdout", "-q", stdin=objects)
    _git(new, "index-pack", "--stdin", stdin=pack)
    if b"\nparent " in _git(new, "cat-file", "commit", base):
        (new / "shallow").write_text(base + "\n")
    if branch:
        _git(new, "update-ref", branch, base)
    else:
        _git(new, "update-ref", "--no-deref", "HEAD", base)
    if not bare:  # a bare repository has no index
        _git(new, "read-tree", base)


def _git(git_dir: Path, *args: str, stdin: bytes = b"", check: bool = True) -> bytes:
    """Plumbing on one repository: `--git-dir` (no discovery, no work tree, no hook), none
    of the caller's GIT_* variables, no reflog written."""
    command = ["git", "-c", "core.logAllRefUpdates=false", f"--git-dir={git_dir}", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | GIT_CONFIG_ENV
    try:
        done = subprocess.run(command, input=stdin, capture_output=True, env=env)
    except FileNotFoundError as error:
        raise UsageError(f"{git_dir}: a task's git repository needs git on the host") from error
    if check and done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip()[-500:]
        raise UsageError(f"{git_dir}: git {args[0]} failed: {reason}")
    return done.stdout


def parse_dockerfile(text: str, workdir_override: str | None = None) -> ImagePlan:
    """The local replay plan of a Dockerfile (line continuations and comments handled);
    `workdir_override` (the task's `[environment] workdir`) is the agent's over any WORKDIR."""
    plan = ImagePlan()
    workdir: str | None = None
    for number, line in _instructions(text):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword not in LOCAL_INSTRUCTIONS:
            plan.needs_docker = f"{keyword} at Dockerfile line {number} needs Docker"
            return plan
        if keyword == "FROM":
            plan.base = rest
        elif keyword == "WORKDIR":
            new = PurePosixPath(workdir or "/") / rest
            workdir = str(new)
        elif keyword == "ENV":
            plan.env.update(_env_pairs(rest))
        else:
            words = _json_or_words(rest)
            if any(w.startswith("--") for w in words) or len(words) < 2:
                plan.needs_docker = f"{keyword} {rest} at Dockerfile line {number} needs Docker"
                return plan
            if any("://" in w for w in words[:-1]):
                plan.needs_docker = f"ADD of a URL at Dockerfile line {number} needs Docker"
                return plan
            plan.copies.append(Copy(tuple(words[:-1]), words[-1], workdir or "/"))
    plan.workdir = workdir_override or workdir or plan.workdir
    reason = _unwritable(plan)
    if reason:
        plan.needs_docker = reason
    return plan


def _instructions(text: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((start, (pending + line).strip()))
        pending = ""
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def _env_pairs(rest: str) -> dict[str, str]:
    words = shlex.split(rest)
    if words and "=" not in words[0]:  # legacy form: ENV KEY value with spaces
        return {words[0]: rest.split(None, 1)[1].strip() if len(words) > 1 else ""}
    return dict(w.split("=", 1) for w in words if "=" in w)


def _json_or_words(rest: str) -> list[str]:
    if rest.startswith("["):
        try:
            value = json.loads(rest)
        except json.JSONDecodeError:
            return []
        return [str(v) for v in value]
    return shlex.split(rest)


def _unwritable(plan: ImagePlan) -> str | None:
    """The local host view is read-only outside the workdir's top directory, /tmp, /root
    and /var: a task that puts files elsewhere needs its own image."""
    allowed = {plan.workdir.strip("/").split("/")[0], *WRITABLE_TOPS}
    if plan.workdir == "/":
        return "WORKDIR / cannot be a local sandbox's workdir; needs Docker"
    for copy in plan.copies:
        dest = PurePosixPath(copy.workdir) / copy.dest
        top = str(dest).strip("/").split("/")[0]
        if top not in allowed:
            return f"COPY to {dest} (outside the workdir) needs Docker"
    return None


def strip_canary(text: str) -> str:
    """The instruction less the canary lines that open it (comments holding the word
    "canary", which mark a benchmark's files so that training sets can leave them out)
    and the blank lines after them: Harbor never shows those to an agent."""
    lines = text.split("\n")
    first = 0
    while first < len(lines) and CANARY_LINE.fullmatch(lines[first].strip()):
        first += 1
    while first < len(lines) and not lines[first].strip():
        first += 1
    return "\n".join(lines[first:])


def is_task_dir(path: Path) -> bool:
    return (path / "task.toml").is_file()


def load_task(path: Path) -> HarborTask:
    """One task directory; a malformed one is a usage error naming the file."""
    path = path.resolve()
    config_path = path / "task.toml"
    try:
        config = TaskConfig.model_validate(tomllib.loads(config_path.read_text()))
    except (OSError, tomllib.TOMLDecodeError, ValidationError, ValueError) as error:
        raise UsageError(f"{config_path}: {error}") from error
    if config.steps:
        raise UsageError(f"{config_path}: multi-step tasks ([[steps]]) are not supported")
    if config.environment.os.lower() != "linux":
        raise UsageError(f"{config_path}: os = {config.environment.os!r}; tasks run on Linux")
    env_tables = {
        "environment": config.environment,
        "verifier": config.verifier,
        "solution": config.solution,
    }
    for table, section in env_tables.items():
        section.env = resolve_env(section.env, f"{config_path}: [{table}] env")
    instruction_path = path / "instruction.md"
    if not instruction_path.is_file():
        raise UsageError(f"{path}: no instruction.md")
    if not (path / "tests" / "test.sh").is_file():
        raise UsageError(f"{path}: no tests/test.sh")
    dockerfile = path / "environment" / "Dockerfile"
    if config.environment.docker_image:  # Harbor runs it, whatever Dockerfile is there
        plan = ImagePlan(
            needs_docker="[environment] docker_image is a prebuilt image; needs Docker"
        )
    elif dockerfile.is_file():
        plan = parse_dockerfile(dockerfile.read_text(), config.environment.workdir)
    else:  # a compose file: Docker's business
        plan = ImagePlan(needs_docker="no environment/Dockerfile; needs Docker")
    instruction = strip_canary(instruction_path.read_text())
    task = HarborTask(path, path.name, instruction, config, plan)
    if plan.needs_docker is None:
        task.environment_tar()  # a COPY of a missing file fails here, at load time
    return task


def find_tasks(path: Path) -> list[HarborTask]:
    """A task directory, or a folder of them (sorted by name)."""
    if is_task_dir(path):
        return [load_task(path)]
    found = sorted(p for p in path.iterdir() if p.is_dir() and is_task_dir(p))
    if not found:
        raise UsageError(f"{path}: no task.toml here or in its subdirectories")
    return [load_task(p) for p in found]
