"""Harbor tasks whose Dockerfile needs a build (RUN): built and run on a real Docker engine,
graded out of the agent's reach as on the local backend."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from reinforge.envs.harbor.agents import ScriptAgent
from reinforge.envs.harbor.environment import HarborEnvironment
from reinforge.envs.registry import load_environment
from reinforge.sandbox.docker import DockerProvider

from .commands import reinforge_here
from .test_harbor_env import played_by, run_all, write_task

pytestmark = pytest.mark.xdist_group("docker")  # their task's image is one, removed after each

TEST_SH = """\
ok=1
[ "$(cat /app/counter.txt)" = 2 ] || ok=0
[ -e /app/stale.txt ] && ok=0
[ "$(cat /app/data.txt)" = shipped ] || ok=0
echo "$ok" > /logs/verifier/reward.txt
"""
SOLVE_SH = "echo 2 > /app/counter.txt\nrm /app/stale.txt\n"


@pytest.fixture
def docker_task(docker_image: str, tmp_path: Path) -> Iterator[Path]:
    """A task whose image is made by RUN steps: the agent must change a file the build
    wrote and delete another; the COPY'd file must survive."""
    dockerfile = (
        f"FROM {docker_image}\nWORKDIR /app\nCOPY data.txt .\n"
        "RUN echo 1 > counter.txt && echo stale > stale.txt\n"
    )
    path = write_task(tmp_path, "bump-counter", TEST_SH, dockerfile=dockerfile, solve_sh=SOLVE_SH)
    (path / "environment" / "data.txt").write_text("shipped\n")
    yield path
    env = load_environment(str(path))
    assert isinstance(env, HarborEnvironment)
    tag = env.runnable["bump-counter"].image.name  # type: ignore[union-attr]
    subprocess.run(["docker", "rmi", "--force", tag], capture_output=True)


def left_behind() -> set[str]:
    """Sandbox containers whose owner has exited, as the provider's reaper tells them: what
    a finished command left (those of a process still running, another test's, are not)."""
    return set(asyncio.run(DockerProvider().stale()))


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("nop", 0.0)])
def test_eval_of_a_task_that_needs_docker(docker_task, tmp_path, agent, reward):
    before = left_behind()
    result = reinforge_here("eval", str(docker_task), "--agent", agent, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "building the image of Harbor task bump-counter" in result.stderr
    rows = [json.loads(r) for r in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert rows and all(r["status"] == "ok" and r["reward"] == reward for r in rows), rows
    assert left_behind() == before  # the agent's and the verifier's containers are gone


async def test_the_agent_container_holds_the_image_and_nothing_of_the_grading(docker_task):
    """The image's files are in the workdir, the tests, solution and reward channel are
    not, and the root is read-only."""
    probe = ScriptAgent(
        "probe",
        "cat counter.txt data.txt; pwd; ls /tests /solution /logs 2>&1; "
        "mkdir -p /logs/verifier 2>&1 || echo no-logs",
    )
    env = played_by(probe, docker_task)
    (trajectory,) = await run_all(env)
    output = trajectory.info["script_output"]
    assert output.startswith("1\nshipped\n/app\n"), output
    for path in ("/tests", "/solution", "/logs"):
        assert f"cannot access '{path}'" in output
    assert "Read-only file system" in output and output.rstrip().endswith("no-logs")
    assert trajectory.reward == 0.0


def test_the_audit_of_a_docker_task_is_clean(docker_task, tmp_path):
    out = tmp_path / "audit.json"
    result = reinforge_here("audit", str(docker_task), "--json", str(out))
    report = json.loads(out.read_text())
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert report["hacked"] == 0 and len(report["exploits"]) >= 12
    assert (report["oracle_mean"], report["nop_mean"]) == (1.0, 0.0)


def test_a_task_whose_build_fails_is_skipped_with_docker_s_reason(docker_image, tmp_path, capsys):
    write_task(tmp_path, "fine", "echo 1 > /logs/verifier/reward.txt\n")
    broken = f"FROM {docker_image}\nRUN echo no-such-step; exit 7\n"
    write_task(tmp_path, "broken", "true\n", dockerfile=broken)
    env = load_environment(str(tmp_path))
    assert list(env.runnable) == ["fine"]
    assert "docker build of" in env.skipped["broken"] and "failed" in env.skipped["broken"]
    assert "skipped Harbor task broken: docker build of" in capsys.readouterr().err


@pytest.fixture
def prebuilt(docker_image: str, tmp_path: Path) -> Iterator[str]:
    """A prebuilt image of the bump-counter task, on the engine under a tag of its own."""
    context = tmp_path / "prebuilt-context"
    context.mkdir()
    (context / "data.txt").write_text("shipped\n")
    (context / "Dockerfile").write_text(
        f"FROM {docker_image}\nWORKDIR /app\nCOPY data.txt .\n"
        "RUN echo 1 > counter.txt && echo stale > stale.txt\n"
    )
    tag = "reinforge-test/prebuilt-bump-counter:1"
    built = subprocess.run(["docker", "build", "--tag", tag, str(context)], capture_output=True)
    assert built.returncode == 0, built.stderr.decode()[-2000:]
    yield tag
    subprocess.run(["docker", "rmi", "--force", tag], capture_output=True)


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("nop", 0.0)])
def test_a_task_of_a_prebuilt_image_runs_it_as_harbor_does(prebuilt, tmp_path, agent, reward):
    """`[environment] docker_image` is run instead of `environment/`, which such a task
    may leave out (here it holds a Dockerfile whose build would fail, never built)."""
    toml = f'[environment]\ndocker_image = "{prebuilt}"\n'
    broken = "FROM no-such-image-anywhere\nRUN exit 7\n"
    with_dockerfile = write_task(tmp_path, "a", TEST_SH, toml=toml, dockerfile=broken)
    without = write_task(tmp_path, "b", TEST_SH, toml=toml, solve_sh=SOLVE_SH)
    (with_dockerfile / "solution" / "solve.sh").write_text(SOLVE_SH)
    shutil.rmtree(without / "environment")
    out = tmp_path / "out"
    result = reinforge_here(
        "eval", str(tmp_path), "--agent", agent, "--tasks", "2", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    assert "skipped" not in result.stderr
    rows = [json.loads(r) for r in (out / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in rows) == ["a", "b"]
    assert all(r["status"] == "ok" and r["reward"] == reward for r in rows), rows


def test_a_prebuilt_image_the_engine_cannot_pull_is_skipped_with_docker_s_reason(
    docker_image, tmp_path
):
    toml = '[environment]\ndocker_image = "reinforge-test/no-such-image:0"\n'
    write_task(tmp_path, "fine", "echo 1 > /logs/verifier/reward.txt\n")
    write_task(tmp_path, "unpulled", "true\n", toml=toml)
    env = load_environment(str(tmp_path))
    assert list(env.runnable) == ["fine"]
    assert env.skipped["unpulled"].startswith("docker pull of reinforge-test/no-such-image:0")
