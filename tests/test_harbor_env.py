"""Harbor tasks end to end in real local sandboxes: agents, grading out of reach, eval."""

from __future__ import annotations

import json
import shlex
import textwrap
from pathlib import Path

import openai
import pytest

from reinforge.envs.builtin.coding import TASKS
from reinforge.envs.config import EnvConfig
from reinforge.envs.harbor.agents import ScriptAgent
from reinforge.envs.harbor.environment import HarborEnvironment
from reinforge.envs.harbor.verify import quiesce_and_snapshot
from reinforge.envs.registry import load_configured, load_environment
from reinforge.errors import UsageError
from reinforge.policy.client import PolicyClient
from reinforge.policy.config import SamplingConfig
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_groups
from reinforge.sandbox import LocalProvider, SandboxSpec
from reinforge.types import Status

from .commands import reinforge_here
from .envs.scripted import ScriptedClient
from .sandbox.helpers import FILL_PIDS
from .test_sandbox_env import call, tool_results

BUNDLED = sorted(p.name for p in TASKS.iterdir() if (p / "task.toml").is_file())


def write_task(
    root: Path,
    name: str,
    test_sh: str,
    *,
    toml: str = "",
    dockerfile: str = "FROM python:3.11-slim\nWORKDIR /app\n",
    solve_sh: str = "true\n",
) -> Path:
    path = root / name
    for sub in ("environment", "tests", "solution"):
        (path / sub).mkdir(parents=True)
    (path / "task.toml").write_text(toml)
    (path / "instruction.md").write_text(f"Task {name}.\n")
    (path / "environment" / "Dockerfile").write_text(dockerfile)
    (path / "tests" / "test.sh").write_text(textwrap.dedent(test_sh))
    (path / "solution" / "solve.sh").write_text(solve_sh)
    return path


def no_model() -> PolicyClient:
    unused = openai.AsyncOpenAI(base_url="http://no-model.invalid/v1", api_key="-")
    return PolicyClient(unused, "none", SamplingConfig())


def played_by(agent: str | ScriptAgent, path: Path, **args: object) -> HarborEnvironment:
    """The Harbor task set at `path`, its agent chosen as `eval.agent` chooses it."""
    env = load_environment(str(path), **args)
    assert isinstance(env, HarborEnvironment)
    env.use_agent(agent)
    return env


async def run_all(env: HarborEnvironment, n: int | None = None) -> list:
    tasks = env.tasks(n or len(env.runnable))
    try:
        groups = await generate_groups(env, tasks, no_model(), RolloutConfig(), 1, 0)
    finally:
        await env.aclose()
    return [g.trajectories[0] for g in groups]


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("nop", 0.0)])
def test_eval_of_the_bundled_set_oracle_scores_1_and_nop_0(tmp_path, agent, reward):
    result = reinforge_here(
        "eval", "coding", "--agent", agent, "--tasks", str(len(BUNDLED)), "--out", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(r) for r in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in rows) == BUNDLED
    assert all(r["status"] == "ok" and r["reward"] == reward for r in rows), rows
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["reward_mean"] == reward and summary["model"] == f"agent:{agent}"


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("nop", 0.0)])
def test_eval_of_one_task_dir_given_by_path(tmp_path, agent, reward):
    task_dir = TASKS / "fix-median-bug"
    result = reinforge_here("eval", str(task_dir), "--agent", agent, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["environment"] == "fix-median-bug" and summary["reward_mean"] == reward


def test_scripted_agents_need_a_harbor_environment():
    result = reinforge_here("eval", "arithmetic", "--agent", "oracle")
    assert result.returncode == 2
    assert "has no 'oracle' agent" in result.stderr


async def test_a_model_works_with_the_tools_and_never_sees_tests_solution_or_logs():
    env = load_environment("coding")
    (task,) = [t for t in env.tasks(len(BUNDLED)) if t.id == "fix-median-bug"]
    fixed = (TASKS / "fix-median-bug" / "solution" / "solve.sh").read_text()
    fixed = fixed.split("<<'EOF'\n", 1)[1].rsplit("EOF", 1)[0]
    client = ScriptedClient(
        [
            call("bash", command="ls /tests /solution /logs 2>&1; pwd"),
            call("bash", command="mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt"),
            call("write_file", path="stats.py", content=fixed),
            "Fixed.",
        ]
    )
    try:
        episode = await env.rollout(client, task)
        listing, prewrite, _ = tool_results(client)
        for path in ("/tests", "/solution", "/logs"):
            assert f"ls: cannot access '{path}': No such file or directory" in listing
        assert listing.rstrip().endswith("/app") and "/app" in client.prompts[0][0]["content"]
        assert prewrite.startswith("[exit code 1]")  # no reward channel during the agent phase
        assert (await env.rubric.score([episode]))[0].total == 1.0
    finally:
        await env.aclose()


PLANTS = {
    "conftest.py": "import os; os._exit(0)\n",
    "sub/sitecustomize.py": "import os; os._exit(0)\n",
    "evil.pth": "import os; os._exit(0)\n",
    "pytest.py": "raise SystemExit(0)\n",
    "unittest/__init__.py": "raise SystemExit(0)\n",
}

CHECK_CLEAN = """\
    fail() { echo "$1"; echo 0 > /logs/verifier/reward.txt; exit 0; }
    for f in conftest.py sub/sitecustomize.py evil.pth pytest.py unittest; do
      [ -e "/app/$f" ] && fail "planted $f survived"
    done
    [ -f /app/kept.txt ] || fail "the agent's work was lost"
    [ -f /app/shipped/conftest.py ] || fail "the task's own conftest.py was removed"
    [ -e /app/escape ] && fail "a link out of the workspace survived"
    [ -e /root/.local/fake ] && fail "the agent's home came along"
    [ -z "$PYTHONPATH" ] || fail "PYTHONPATH=$PYTHONPATH"
    [ "$(command -v python3)" = /usr/bin/python3 ] || fail "python3 is $(command -v python3)"
    [ -z "$PYTHONSAFEPATH" ] || fail "PYTHONSAFEPATH=$PYTHONSAFEPATH"
    python3 -c 'import socket; socket.create_connection(("192.0.2.1", 9), 2)' 2>/dev/null \
      && fail "the verifier has a network"
    echo 1 > /logs/verifier/reward.txt
"""


async def test_what_the_agent_plants_is_gone_before_the_verifier_runs(tmp_path):
    path = write_task(
        tmp_path,
        "plants",
        CHECK_CLEAN,
        dockerfile=(
            "FROM python:3.11-slim\nWORKDIR /app\nENV PYTHONPATH=/app PATH=/app/bin:/usr/bin\n"
            "COPY conftest.py /app/shipped/conftest.py\n"
        ),
    )
    (path / "environment" / "conftest.py").write_text("# the task's own\n")
    env = load_environment(str(path))
    plant = " && ".join(
        f"mkdir -p $(dirname {name}) && printf %s {json.dumps(text)} > {name}"
        for name, text in PLANTS.items()
    )
    client = ScriptedClient(
        [
            call("bash", command=plant),
            call("bash", command="echo work > kept.txt && ln -s /etc/passwd escape"),
            call("bash", command="mkdir -p /root/.local && touch /root/.local/fake"),
            call("bash", command="(setsid sh -c 'while :; do touch /app/late; sleep 1; done' &)"),
            "Done.",
        ]
    )
    (task,) = env.tasks(1)
    try:
        episode = await env.rollout(client, task)
        assert all(r.startswith("[exit code 0]") for r in tool_results(client)), client.prompts
        scores = (await env.rubric.score([episode]))[0]
        assert scores.total == 1.0, episode.state.get("verifier_output")
    finally:
        await env.aclose()


async def test_quiesce_leaves_no_agent_process():
    provider = LocalProvider()
    try:
        async with await provider.create(SandboxSpec()) as sandbox:
            await sandbox.exec("(setsid sh -c 'while :; do sleep 1; done' &); (sleep 1000 &)")
            await quiesce_and_snapshot(sandbox, "/workspace")
            left = await sandbox.exec('set -- /proc/[0-9]*; echo "$#"')
            assert left.stdout == b"2\n"  # pid 1 and this shell
    finally:
        await provider.aclose()


async def test_a_failing_verifier_is_an_error_not_a_zero(tmp_path):
    write_task(tmp_path, "b-no-reward", "echo broken; exit 3\n")
    write_task(tmp_path, "c-garbage", "echo passed > /logs/verifier/reward.txt\n")
    write_task(tmp_path, "d-ok", "echo 0 > /logs/verifier/reward.txt; exit 1\n")
    env = played_by("nop", tmp_path)
    trajectories = await run_all(env)
    by_id = {t.task_id: t for t in trajectories}
    assert "wrote no reward file" in by_id["b-no-reward"].error
    assert "not a finite number" in by_id["c-garbage"].error
    for name in ("b-no-reward", "c-garbage"):
        assert by_id[name].status == Status.ERROR and by_id[name].reward is None
    assert by_id["d-ok"].status == Status.OK and by_id["d-ok"].reward == 0.0


async def test_what_the_agent_does_to_its_own_grading_scores_0_not_an_error(tmp_path):
    """A failure the agent turns into an error would leave the batch, and a policy would
    learn to fail that way: a workspace too large to copy (a sparse file uses no disk)
    and a candidate that outruns the verifier score 0, with the reason in the info."""
    write_task(
        tmp_path,
        "sparse",
        "echo 1 > /logs/verifier/reward.txt\n",
        solve_sh="truncate -s 1T /app/big\n",
    )
    write_task(
        tmp_path,
        "slow-candidate",
        "python3 /app/solution.py; echo 1 > /logs/verifier/reward.txt\n",
        toml="[verifier]\ntimeout_sec = 1.0\n",
        solve_sh="echo 'import time; time.sleep(60)' > /app/solution.py\n",
    )
    trajectories = await run_all(played_by("oracle", tmp_path))
    by_id = {t.task_id: t for t in trajectories}
    assert "over 256 MiB as a tar" in by_id["sparse"].info["verifier_fault"]
    assert "timed out after 1 s" in by_id["slow-candidate"].info["verifier_fault"]
    for trajectory in trajectories:
        assert trajectory.status == Status.OK and trajectory.reward == 0.0, trajectory.error


async def test_processes_that_fill_the_pids_limit_score_0_by_their_fault_not_an_error(tmp_path):
    """Processes that outlive the agent phase or test.sh and fill the pids limit leave no
    pid to start the next command with: the sandbox stays up, and the rollout is a 0 by
    the agent's fault. (Where the command that kills them wins a freed pid, they die and
    the grading goes on as usual.)"""
    write_task(tmp_path, "agent-fills", "echo 1 > /logs/verifier/reward.txt\n", solve_sh=FILL_PIDS)
    write_task(
        tmp_path,
        "candidate-fills",
        "bash /app/solution.sh; echo 1 > /logs/verifier/reward.txt\n",
        solve_sh=f"echo {shlex.quote(FILL_PIDS)} > /app/solution.sh\n",
    )
    trajectories = await run_all(played_by("oracle", tmp_path))
    by_id = {t.task_id: t for t in trajectories}
    for trajectory in trajectories:
        assert trajectory.status == Status.OK, trajectory.error
    agent = by_id["agent-fills"]
    assert agent.reward == 1.0 or (
        agent.reward == 0.0
        and agent.info["verifier_fault"].startswith("could not stop the agent's processes")
    ), agent.info
    candidate = by_id["candidate-fills"]
    assert candidate.reward == 0.0 and "test.sh" in candidate.info["verifier_fault"]


async def test_the_agent_timeout_of_task_toml_ends_the_agent_phase_and_grading_goes_on(tmp_path):
    write_task(
        tmp_path,
        "slow",
        "cat /app/started > /logs/verifier/reward.txt\n",
        toml="[agent]\ntimeout_sec = 1.0\n",
        solve_sh="echo 1 > /app/started; sleep 60\n",
    )
    (trajectory,) = await run_all(played_by("oracle", tmp_path))
    assert trajectory.status == Status.TRUNCATED and trajectory.reward == 1.0
    assert trajectory.info["agent_timed_out"] is True


async def test_the_workdir_and_env_of_task_toml_reach_the_agent_and_the_verifier(
    tmp_path, monkeypatch
):
    """`[environment] workdir` is where the agent works, over the Dockerfile's WORKDIR;
    `[environment] env` (a `${VAR}` read from the host) reaches the agent and the verifier,
    `[verifier] env` the verifier alone."""
    monkeypatch.setenv("TASK_SECRET", "from-host")
    test_sh = """\
        seen="$(cat /srv/work/seen)"
        if [ "$seen" = "/srv/work strict from-host -" ] && [ "$MODE$CHECK" = stricton ]; then
          echo 1; else echo 0; fi > /logs/verifier/reward.txt
        """
    write_task(
        tmp_path,
        "moved",
        test_sh,
        toml=(
            "[environment]\nworkdir = '/srv/work'\n"
            "env = { MODE = 'strict', SECRET = '${TASK_SECRET}' }\n"
            "[verifier]\nenv = { CHECK = 'on' }\n"
        ),
        solve_sh='echo "$(pwd) $MODE $SECRET ${CHECK:--}" > seen\n',
    )
    (trajectory,) = await run_all(played_by("oracle", tmp_path))
    assert trajectory.reward == 1.0, trajectory.info


async def test_the_oracle_reads_the_files_its_instruction_names_when_read_file_is_offered(
    tmp_path,
):
    path = write_task(
        tmp_path,
        "fix",
        "grep -qx 'b = 2' /app/b.txt && echo 1 > /logs/verifier/reward.txt\n",
        dockerfile="FROM python:3.11-slim\nWORKDIR /app\nCOPY b.txt /app/b.txt\n",
        solve_sh="#!/bin/bash\nsed -i 's/b = 1/b = 2/' b.txt\n",
    )
    (path / "environment" / "b.txt").write_text("b = 1\n")
    (path / "instruction.md").write_text(
        "In `/app/b.txt` set b to 2; `/app/missing.txt` is not there; `/app/b.txt` again.\n"
    )
    (trajectory,) = await run_all(played_by("oracle", path))
    _, _, reads, report, solve, _, answer = trajectory.messages
    (read,) = reads["tool_calls"]  # each named file once, and only those that exist
    assert read["function"] == {"name": "read_file", "arguments": '{"path": "/app/b.txt"}'}
    assert report == {
        "role": "tool", "tool_call_id": read["id"], "name": "read_file", "content": "b = 1\n",
    }  # fmt: skip
    assert solve["tool_calls"][0]["function"]["name"] == "bash" and trajectory.reward == 1.0
    assert answer["role"] == "assistant"

    bash_only = played_by("oracle", path, tools=["bash"])
    assert [t.name for t in bash_only.harness.tools] == ["bash"]
    nop = bash_only.with_agent("nop")  # the audit's baselines keep the offered tools
    assert [t.name for t in nop.harness.tools] == ["bash"]
    await nop.aclose()
    (trajectory,) = await run_all(bash_only)
    assert [m["role"] for m in trajectory.messages] == [
        "system", "user", "assistant", "tool", "assistant",
    ]  # fmt: skip
    with pytest.raises(UsageError, match="config env.args.tools.0: Input should be 'bash'"):
        load_environment(str(path), tools=["shell"])


def test_tasks_that_need_docker_are_skipped_with_a_reason_where_no_engine_answers(tmp_path, capsys):
    write_task(tmp_path, "runs", "true\n")
    write_task(tmp_path, "builds", "true\n", dockerfile="FROM x\nRUN apt-get update\n")
    env = load_environment(str(tmp_path), docker="no-such-docker")
    assert list(env.runnable) == ["runs"]
    reason = "RUN at Dockerfile line 2 needs Docker, and no Docker engine: no `no-such-docker`"
    assert env.skipped["builds"].startswith(reason)
    assert f"skipped Harbor task builds: {reason}" in capsys.readouterr().err
    with pytest.raises(UsageError, match="no task can run here"):
        load_environment(str(tmp_path / "builds"), docker="")


def test_a_task_dir_is_an_env_name_for_train_too(tmp_path):
    write_task(tmp_path, "one", "true\n")
    env = load_configured(EnvConfig(name=str(tmp_path / "one"), max_turns=3))
    assert isinstance(env, HarborEnvironment) and env.harness.max_turns == 3
    for limit in ("max_turns", "max_tokens_per_turn"):
        with pytest.raises(UsageError, match=f"^config env.args.{limit}: moved to env.{limit}$"):
            load_configured(EnvConfig(name=str(tmp_path / "one"), args={limit: 3}))
    with pytest.raises(UsageError, match="no task.toml"):
        load_environment(str(tmp_path / "one" / "tests"))


@pytest.mark.parametrize(
    ("task_id", "path", "content"),
    [
        ("fix-median-bug", "stats.py", "import os\nos._exit(0)\n"),  # exit 0 before the tests
        ("fix-median-bug", "stats.py", "raise SystemExit(0)\n"),
        ("make-roman-test-pass", "test_roman.py", "print('OK')\n"),  # edit the visible test
        ("implement-slugify", "/logs/verifier/reward.txt", "1\n"),  # pre-write the reward
    ],
)
async def test_simple_hacks_score_0_on_the_bundled_tasks(task_id, path, content):
    env = load_environment("coding")
    (task,) = [t for t in env.tasks(len(BUNDLED)) if t.id == task_id]
    client = ScriptedClient([call("write_file", path=path, content=content), "Done."])
    try:
        episode = await env.rollout(client, task)
        assert (await env.rubric.score([episode]))[0].total == 0.0
    finally:
        await env.aclose()


CWD_IMPORT_TEST = """\
import unittest

import calc


class Add(unittest.TestCase):
    def test_add(self):
        self.assertEqual(calc.add(2, 3), 5)
"""


async def test_tests_that_import_the_agents_module_from_the_working_directory_pass(tmp_path):
    """A common Harbor pattern: `cd /app && python3 -m unittest`, the test importing the
    agent's module because `-m` puts the working directory first. The oracle scores 1,
    as under Harbor's own runner, and the nop agent 0."""
    path = write_task(
        tmp_path,
        "cwd-import",
        """\
        cd /app
        if python3 -m unittest discover -s /tests -p 'test_*.py'; then
          echo 1 > /logs/verifier/reward.txt
        else
          echo 0 > /logs/verifier/reward.txt
        fi
        """,
        dockerfile="FROM python:3.11-slim\nWORKDIR /app\nCOPY calc.py /app/calc.py\n",
        solve_sh="echo 'def add(a, b): return a + b' > /app/calc.py\n",
    )
    (path / "environment" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (path / "tests" / "test_calc.py").write_text(CWD_IMPORT_TEST)
    for agent, reward in (("oracle", 1.0), ("nop", 0.0)):
        (trajectory,) = await run_all(played_by(agent, path))
        assert trajectory.reward == reward, trajectory.info.get("verifier_output")


HIDDEN_CHECK = """\
import subprocess
import sys

# expected-answer-4711: in this file, in answers.txt and in test.sh
PROBE = '''
import glob
marker = "expected-" + "answer-4711"
for path in glob.glob("/tests/*") + glob.glob("/proc/[0-9]*/cmdline"):
    try:
        with open(path, errors="replace") as f:
            if marker in f.read():
                print(path)
    except OSError:
        pass
'''
probe = [sys.executable, "-I", "-c", PROBE]
seen = subprocess.run(probe, user=65534, group=65534, extra_groups=[], capture_output=True,
                      text=True, cwd="/tmp").stdout
print("seen:", seen.split())
sys.exit(1 if seen.strip() else 0)
"""


async def test_the_tests_are_unreadable_to_the_candidates_user(tmp_path):
    """The tests stay root's while they run: a candidate run as nobody reads neither the
    files under /tests nor test.sh's text from any process's command line."""
    path = write_task(
        tmp_path,
        "hidden",
        """\
        # expected-answer-4711
        if python3 -I /tests/check_hidden.py; then
          echo 1 > /logs/verifier/reward.txt
        else
          echo 0 > /logs/verifier/reward.txt
        fi
        """,
    )
    (path / "tests" / "answers.txt").write_text("expected-answer-4711\n")
    (path / "tests" / "check_hidden.py").write_text(HIDDEN_CHECK)
    (trajectory,) = await run_all(played_by("nop", path))
    assert trajectory.reward == 1.0, trajectory.info.get("verifier_output")
