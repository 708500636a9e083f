"""Grading a Harbor task out of the agent's reach.

The agent's sandbox never holds the tests, the solution or the reward file. After the
agent phase every process in it is killed and its workspace is copied out as a tar; the
sandbox is then destroyed. The verifier runs in a *fresh* sandbox with the network off:
the agent's workspace (filtered: nothing outside the workdir, no links out of it), then
`tests/` from the pristine task directory at `/tests`, a path the agent never had, and an
empty `/logs/verifier` created by the host only now, on a small disk of its own (a full
disk cannot stop `test.sh` from writing its reward). Only the workspace crosses over, so
whatever the agent planted elsewhere (a fake `python3`, sitecustomize or `.pth` files in
site-packages or ~/.local, daemons, a pre-written reward) is gone. What is left in the
workspace is neutralised where a pytest- or python-based verifier would pick it up; see
`VERIFIER_ENV` and `neutralise_script`.

`test.sh` may run the candidate's code in its own sandbox, so the reward it leaves is
trusted only when `test.sh` ran as read when it started (bash holds its text, not the
file), ended by itself (not killed by a signal), left no process running that could have
rewritten the reward after it, and the reward is a regular file in a real `/logs/verifier`
(not a link to a file that holds a number, nor a directory that blocks `test.sh`'s write).
"""

from __future__ import annotations

import io
import json
import math
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from reinforge.sandbox.protocol import (
    DEFAULT_PATH,
    Sandbox,
    SandboxProvider,
    SandboxSpec,
    TarTooLarge,
)

TESTS_DIR = "/tests"
LOGS_DIR = "/logs/verifier"
LOGS_DISK_BYTES = 16 << 20
"""The size of `/logs/verifier`'s own disk: a candidate that fills the verifier's shared
disk leaves `test.sh` this room for its reward (and its logs)."""
MAX_WORKSPACE_BYTES = 256 << 20

COUNT_LIVE = """
left=0
for p in /proc/[0-9]*; do
  case "${p#/proc/}" in 1|$$) continue ;; esac
  while read -r key value _; do
    [ "$key" = State: ] && { [ "$value" = Z ] || left=$((left + 1)); break; }
  done 2>/dev/null <"$p/status"
done
"""
"""Sets `left` to how many processes are running besides pid 1 and this shell (zombies
are dead: a Docker container's pid 1 never reaps them)."""

QUIESCE = f"""
i=0
while [ $i -lt 100 ]; do
  kill -KILL -1 2>/dev/null
  {COUNT_LIVE}
  [ "$left" -eq 0 ] && exit 0
  i=$((i + 1)); sleep 0.02
done
exit 1
"""
"""Run inside the agent's sandbox: SIGKILL every process but pid 1 and this shell (kill -1
spares both) until no other one runs."""

OUTLIVED = f"""{COUNT_LIVE}
echo "$left"
"""
"""Run in the verifier's sandbox right after test.sh: how many processes are still running
besides pid 1 and this shell."""

NOT_REGULAR = f"""
[ -d {LOGS_DIR} ] && [ ! -L {LOGS_DIR} ] || echo {LOGS_DIR}
for f in {LOGS_DIR}/reward.txt {LOGS_DIR}/reward.json; do
  if [ -L "$f" ] || {{ [ -e "$f" ] && [ ! -f "$f" ]; }}; then echo "$f"; fi
done
"""
"""Prints `/logs/verifier` unless it is a real directory, and each reward file that is
there as a link or as anything but a regular file."""

VERIFIER_ENV = {
    "PATH": DEFAULT_PATH,  # system directories only: no fake python3 from the workspace
    "HOME": "/root",  # a fresh, empty home: no ~/.local site-packages or .pth files
    "PYTHONNOUSERSITE": "1",  # a workspace under /root cannot act as the user site
    "PYTHONDONTWRITEBYTECODE": "1",
}
"""The base of the verifier's whole environment (see `verifier_env`). It leaves python's
own rules for `sys.path` alone (no `PYTHONSAFEPATH`): a Harbor test that runs
`cd /app && python3 -m unittest ...` imports the agent's module from the working
directory, and must do so here as under Harbor's own runner."""

UNSAFE_PREFIXES = ("PATH", "PYTHON", "LD_", "PYTEST_", "BASH_FUNC_", "PERL", "RUBY", "NODE_")
UNSAFE_NAMES = frozenset(
    "BASH_ENV ENV SHELLOPTS BASHOPTS PS4 CDPATH GLOBIGNORE GCONV_PATH "
    "JAVA_TOOL_OPTIONS _JAVA_OPTIONS JDK_JAVA_OPTIONS".split()
)
"""Variables of the image's ENV that make bash, python, the loader or another interpreter
load code or change what runs: an image that points one into the workspace (`BASH_ENV=
/app/.env.sh`) would run the agent's file in `test.sh`, so each is blanked."""

ABSENT_STDLIB = r"""
import importlib.machinery, importlib.util, os, shutil, sys
workdir, keep = sys.argv[1], set(sys.argv[2:])
absent = set()
for name in sys.stdlib_module_names:
    try:
        if importlib.util.find_spec(name) is None:
            absent.add(name)
    except (ImportError, ValueError):
        absent.add(name)
suffixes = tuple(importlib.machinery.all_suffixes())
for root, dirs, files in os.walk(workdir):
    for name in [d for d in dirs if d in absent]:
        dirs.remove(name)
        if os.path.join(root, name) not in keep:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    for name in files:
        path = os.path.join(root, name)
        if name.endswith(suffixes) and name.split(".")[0] in absent and path not in keep:
            os.remove(path)
"""
"""Deletes every module or package in the workspace named like a standard-library module
that this python lacks (`msvcrt`, `_winapi`, `winreg` on Linux). The standard library
tries such optional imports itself (`subprocess` tries `msvcrt`), so a test that put the
workspace on `sys.path`, even after the standard library, would run the agent's file as
root. No sound task ships one: on this platform no such module exists."""


RUN_TEST_SH = 'script=$(cat) && exec </dev/null && eval "$script"'
"""How bash runs `test.sh`: its text comes on stdin and is held in bash's memory, so code
that test.sh runs cannot change what runs next by editing the file, and no command line
shows the text (another uid can read a process's argv in /proc, not its memory). stdin is
then /dev/null, as for any command, so the candidate cannot read the script from it."""

PYTEST_CONFIGS = ("pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
PLANTED = ("conftest.py", "sitecustomize.py", "usercustomize.py", "*.pth")


class VerifierError(RuntimeError):
    """The verifier failed to give a reward (crashed, no or bad reward file): the rollout
    is an error, never a silent 0."""


class AgentFault(VerifierError):
    """What the agent did stopped its grading: a workspace too large to copy, processes
    that will not die, a candidate that outran the verifier's time, killed test.sh, left a
    process behind or replaced a reward file. The rollout scores 0, a failure like any
    other: as an error it would leave the batch, and a policy would learn to fail that way
    rather than plainly."""


@dataclass(frozen=True)
class VerifierResult:
    reward: float
    rewards: dict[str, float]
    exit_code: int
    output: str


async def quiesce_and_snapshot(sandbox: Sandbox, workdir: str) -> bytes:
    """Kill every agent process, then the workspace as a tar (top entry: its basename)."""
    result = await sandbox.exec(["/bin/sh", "-c", QUIESCE], timeout=30)
    if not result.ok:
        raise AgentFault(f"could not stop the agent's processes: {result.stderr[-500:]!r}")
    try:
        return await sandbox.download_tar(workdir, max_bytes=MAX_WORKSPACE_BYTES)
    except TarTooLarge as error:
        raise AgentFault(
            f"the workspace is over {MAX_WORKSPACE_BYTES >> 20} MiB as a tar (a sparse file "
            "counts at its full size)"
        ) from error


def filter_workspace(tar_bytes: bytes, workdir: str) -> bytes:
    """The agent's tar, keeping only regular files, directories and symlinks that stay
    inside the workdir (tarfile's `data` filter, and each link followed through the tar's
    other links): it was made in the agent's sandbox."""
    parent = PurePosixPath(workdir).parent
    top = PurePosixPath(workdir).name
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(tar_bytes)) as source,
        tarfile.open(fileobj=out, mode="w") as target,
    ):
        members = source.getmembers()
        links = {PurePosixPath(m.name): m.linkname for m in members if m.issym()}
        for member in members:
            name = PurePosixPath(member.name)
            if (
                not name.parts
                or name.parts[0] != top
                or ".." in name.parts
                or not (member.isfile() or member.isdir() or member.issym())
            ):
                continue
            try:
                tarfile.data_filter(member, str(Path("/") / parent))
            except tarfile.FilterError:
                continue
            if member.issym() and _resolve(name, links, top) is None:
                continue
            kept = tarfile.TarInfo(member.name)
            kept.type, kept.size, kept.linkname = member.type, member.size, member.linkname
            kept.mode = 0o755 if member.isdir() or member.mode & 0o100 else 0o644
            kept.mtime = member.mtime
            data = source.extractfile(member) if member.isfile() else None
            target.addfile(kept, data)
    return out.getvalue()


MAX_LINK_HOPS = 40
"""As the kernel's limit: past it a chain of links is a loop."""


def _resolve(
    path: PurePosixPath, links: dict[PurePosixPath, str], top: str
) -> PurePosixPath | None:
    """Where `path` leads once every link of the tar on the way is followed, as the kernel
    would in the verifier; None if it ever leaves `top` (or loops). Read lexically, a
    target such as `b/b/b/../../..` stays inside, yet with `b -> .` it reaches `/`."""
    done: list[str] = []
    todo = list(path.parts)
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if len(done) <= 1:
                return None
            done.pop()
            continue
        done.append(part)
        target = links.get(PurePosixPath(*done))
        if target is not None:
            hops += 1
            if hops > MAX_LINK_HOPS or target.startswith("/"):
                return None
            done.pop()
            todo = [*PurePosixPath(target).parts, *todo]
    return PurePosixPath(*done) if done and done[0] == top else None


def tests_tar(tests_dir: Path) -> bytes:
    """A directory of the pristine task (`tests/`, `solution/`), as a tar of its contents."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for child in sorted(tests_dir.rglob("*")):
            if child.is_file():
                tar.add(child, arcname=str(child.relative_to(tests_dir)))
    return out.getvalue()


def neutralise_script(workdir: str, shipped: set[str]) -> str:
    """Shell run in the verifier sandbox before the tests: delete what the agent planted in
    the workspace that a python/pytest verifier would load (conftest.py, sitecustomize,
    usercustomize, .pth, a shadowing pytest/unittest package or module, a module named
    like an absent standard-library one: `ABSENT_STDLIB`), keeping files the task's own
    environment shipped. Pytest config files in the workspace are ignored by
    pointing pytest at the tests' own config (or none) through PYTEST_ADDOPTS."""
    names = " -o ".join(f"-name {shlex.quote(n)}" for n in PLANTED)
    shadows = "pytest _pytest unittest py pluggy".split()
    shadow_names = " -o ".join(
        f"-name {shlex.quote(n)} -o -name {shlex.quote(n + '.py')}" for n in shadows
    )
    keep = " ".join(f"! -path {shlex.quote(p)}" for p in sorted(shipped))
    w = shlex.quote(workdir)
    absent_args = " ".join(shlex.quote(a) for a in (ABSENT_STDLIB, workdir, *sorted(shipped)))
    return (
        f"find {w} \\( {names} \\) {keep} -exec rm -rf {{}} + 2>/dev/null; "
        f"find {w} -maxdepth 1 \\( {shadow_names} \\) {keep} -exec rm -rf {{}} + 2>/dev/null; "
        f"! command -v python3 >/dev/null || (cd / && python3 -I -S -c {absent_args}) || exit 1; "
        "true"
    )


def pytest_config_option(tests_dir: Path, tests_path: str = TESTS_DIR) -> str:
    """`-c` for the tests' own pytest config if they ship one, else an empty config: the
    workspace's pytest.ini/pyproject/tox/setup.cfg options never apply. `tests_path` is
    where `tests_dir` is inside the verifier's sandbox."""
    for name in PYTEST_CONFIGS:
        if (tests_dir / name).is_file():
            return f"-c {tests_path}/{name} --rootdir={tests_path}"
    return f"-c /dev/null --rootdir={tests_path}"


def verifier_env(
    task_env: dict[str, str],
    image_env: dict[str, str],
    tests_dir: Path,
    workdir: str,
    tests_path: str = TESTS_DIR,
) -> dict[str, str]:
    """The verifier's environment: `VERIFIER_ENV`, the pytest options for these tests, the
    task's `[verifier] env`, and the image's ENV with what could make an interpreter load
    the agent's code blanked (`UNSAFE_PREFIXES`, `UNSAFE_NAMES`; a container has the
    image's ENV already, and an empty value is an unset one to bash, python and the
    loader). The image's PATH directories outside the workdir come before the system
    ones: the workdir holds what the agent left, the rest is the pristine image."""
    env = {
        k: "" if k.startswith(UNSAFE_PREFIXES) or k in UNSAFE_NAMES else v
        for k, v in image_env.items()
    }
    env.update(VERIFIER_ENV)
    image_dirs = [
        d
        for d in image_env.get("PATH", "").split(":")
        if d.startswith("/") and not PurePosixPath(d).is_relative_to(workdir)
    ]
    env["PATH"] = ":".join(dict.fromkeys([*image_dirs, *DEFAULT_PATH.split(":")]))
    env["PYTEST_ADDOPTS"] = (
        f"--confcutdir={tests_path} -p no:cacheprovider "
        + pytest_config_option(tests_dir, tests_path)
    )
    env.update(task_env)
    return env


async def run_verifier(
    provider: SandboxProvider,
    spec: SandboxSpec,
    workspace_tar: bytes,
    tests_dir: Path,
    shipped: set[str],
    env: dict[str, str],
    timeout_s: float,
) -> VerifierResult:
    """Grade a workspace in a fresh sandbox; raises VerifierError when no reward comes."""
    sandbox = await provider.create(spec)
    try:
        workdir = spec.workdir
        # An image may hold files in the workdir: the graded tree is the workspace alone.
        await sandbox.exec(["find", workdir, "-mindepth", "1", "-delete"], timeout=60)
        await sandbox.upload_tar(workspace_tar, str(PurePosixPath(workdir).parent))
        setup = await sandbox.exec(neutralise_script(workdir, shipped), timeout=60)
        if not setup.ok:
            raise VerifierError(f"verifier setup failed: {setup.stderr[-500:]!r}")
        await sandbox.upload_tar(tests_tar(tests_dir), TESTS_DIR)
        hide = await sandbox.exec(["chmod", "-R", "go-rwx", TESTS_DIR], timeout=60)
        if not hide.ok:
            raise VerifierError(f"could not hide the tests: {hide.stderr[-500:]!r}")
        script = (tests_dir / "test.sh").read_bytes()
        result = await sandbox.exec(
            ["bash", "-c", RUN_TEST_SH, f"{TESTS_DIR}/test.sh"],
            cwd=workdir,
            env=env,
            timeout=timeout_s,
            stdin=script,
        )
        output = (result.stdout + result.stderr).decode(errors="replace")[-4000:]
        if result.timed_out:
            raise AgentFault(f"the verifier timed out after {timeout_s:g} s: {output[-500:]}")
        running = await sandbox.exec(["/bin/sh", "-c", OUTLIVED], timeout=30)
        if not running.ok:  # no process can start: what test.sh left fills the sandbox
            left = running.stderr[-500:]
            raise AgentFault(f"processes left after test.sh fill the sandbox: {left!r}")
        outlived = int(running.stdout.decode().strip() or 0)
        quiesced = await sandbox.exec(["/bin/sh", "-c", QUIESCE], timeout=30)
        if not quiesced.ok:
            left = quiesced.stderr[-500:]
            raise AgentFault(f"processes left after test.sh would not die: {left!r}")
        # Nothing runs from here on: the reward files are what they will stay.
        not_regular = (await sandbox.exec(["/bin/sh", "-c", NOT_REGULAR], timeout=30)).stdout
        files = await sandbox.read_files([f"{LOGS_DIR}/reward.txt", f"{LOGS_DIR}/reward.json"])
    finally:
        await sandbox.close()
    _check_ending(result.exit_code, outlived, not_regular.decode(errors="replace").split(), output)
    reward, rewards = parse_reward(
        files[f"{LOGS_DIR}/reward.txt"], files[f"{LOGS_DIR}/reward.json"]
    )
    if reward is None:
        raise VerifierError(
            f"the verifier (exit code {result.exit_code}) wrote no reward file: {output[-500:]}"
        )
    return VerifierResult(reward, rewards, result.exit_code, output)


def _check_ending(exit_code: int, outlived: int, not_regular: list[str], output: str) -> None:
    """Raise AgentFault when the reward cannot be trusted to be what test.sh wrote: only
    what test.sh ran, the candidate, could have made it so."""
    if exit_code > 128:
        raise AgentFault(
            f"test.sh was killed by signal {exit_code - 128}: a reward left now is not its "
            f"verdict: {output[-500:]}"
        )
    if outlived:
        raise AgentFault(
            f"{outlived} process(es) outlived test.sh and could have rewritten its reward"
        )
    if not_regular:
        raise AgentFault(f"not a regular file: {', '.join(not_regular)}")


def parse_reward(
    text: bytes | None, json_bytes: bytes | None
) -> tuple[float | None, dict[str, float]]:
    """Read as Harbor reads them: reward.json, an object {name: number}, wins where both are
    there (its `reward` key is the reward, else the mean); reward.txt holds one number. A
    file that is there but unreadable, or a reward that is not a finite number, raises
    VerifierError: NaN or an infinity would poison every mean and advantage it joined."""
    if json_bytes is not None:
        try:
            value: Any = json.loads(json_bytes)
        except (ValueError, UnicodeDecodeError) as error:
            raise VerifierError(f"reward.json is not JSON: {error}") from error
        if not isinstance(value, dict) or not value:
            raise VerifierError(f"reward.json is not an object {{name: number}}: {value!r:.100}")
        bad = {k: v for k, v in value.items() if not _is_finite_number(v)}
        if bad:
            raise VerifierError(
                f"reward.json holds rewards that are not finite numbers: {bad!r:.100}"
            )
        rewards = {str(k): float(v) for k, v in value.items()}
        return rewards.get("reward", sum(rewards.values()) / len(rewards)), rewards
    if text is None:
        return None, {}
    try:
        reward = float(text.decode().strip())
    except (UnicodeDecodeError, ValueError):
        reward = math.nan
    if not math.isfinite(reward):
        raise VerifierError(f"reward.txt is not a finite number: {text[:100]!r}")
    return reward, {}


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)
