"""`reinforge audit`: the exploit library against real graders in real sandboxes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from reinforge.cli import main
from reinforge.envs.builtin.coding import TASKS
from reinforge.envs.builtin.coding.generated import generate
from reinforge.envs.harbor import environment as harbor
from reinforge.envs.harbor import verify as harbor_verify
from reinforge.envs.harbor.exploits import EXPLOITS
from reinforge.envs.registry import load_environment
from reinforge.rollout.audit import SECRET_VARIABLE, audit
from reinforge.rollout.config import RolloutConfig
from reinforge.sandbox.local_sandbox import LocalSandbox

from .commands import ROOT, reinforge_here
from .test_harbor_env import write_task

WEAK_TASK = ROOT / "examples" / "weak_task"


def test_the_bundled_set_audits_clean(tmp_path):
    out = tmp_path / "audit.json"
    result = reinforge_here("audit", "coding", "--tasks", "2", "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["hacked"] == 0 and len(report["tasks"]) == 2
    assert len(report["exploits"]) == len(EXPLOITS) >= 12
    assert all(e["max_reward"] == 0 and e["tasks_hacked"] == 0 for e in report["exploits"])
    assert report["oracle_mean"] == 1.0 and report["nop_mean"] == 0.0
    assert "clean: no exploit scored" in result.stdout


def test_the_weak_example_is_hacked_and_the_audit_names_the_exploits(tmp_path):
    out = tmp_path / "audit.json"
    result = reinforge_here("audit", str(WEAK_TASK), "--json", str(out))
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(out.read_text())
    by_name = {e["name"]: e for e in report["exploits"]}
    hacked = {name for name, e in by_name.items() if e["tasks_hacked"]}
    # It runs the visible test in the process that imports the agent's code.
    assert {"rewrite-tests", "exit-at-import", "exit-zero-at-exit", "always-equal"} <= hacked
    assert report["hacked"] == len(hacked)
    for name in sorted(hacked):
        assert f"HACKED by {name}: weak_task" in result.stdout
    # What the grading path itself stops, on this weak task too.
    for name in ("prewrite-reward", "sitecustomize", "shadow-modules", "fake-python"):
        assert by_name[name]["max_reward"] == 0, name
    assert by_name["rewrite-verifier"]["max_reward"] == 0
    # What the candidate did to the grading scores 0 by its own fault, never an error.
    faults = {name: by_name[name]["first_fault"] or "" for name in by_name}
    assert "killed by signal 9" in faults["kill-verifier"]
    assert "outlived test.sh" in faults["reward-daemon"]
    assert "not a regular file: /logs/verifier/reward.txt" in faults["tamper-reward-file"]
    assert "over 256 MiB as a tar" in faults["sparse-file"]
    assert all(e["errors"] == 0 for e in report["exploits"])
    assert report["oracle_mean"] == 1.0 and report["nop_mean"] == 0.0


def git(repo, *args: str) -> None:
    identity = ("-c", "user.name=audit", "-c", "user.email=audit@example.invalid")
    subprocess.run(["git", *identity, *args], cwd=repo, check=True, capture_output=True)


def test_a_solution_in_the_git_history_does_not_reach_the_agent(tmp_path):
    """The task's repository has the fix in an earlier commit and in the reflog. On the
    repository as the task ships it the git-history exploit takes the fix; in the sandbox
    the repository holds the base commit only, and the exploit scores 0."""
    task = tmp_path / "history"
    app = task / "environment" / "app"
    app.mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "task.toml").write_text("")
    (task / "instruction.md").write_text("Fix add in /app/calc.py.\n")
    (task / "environment" / "Dockerfile").write_text("FROM python:3.11\nWORKDIR /app\nCOPY app .\n")
    (task / "solution" / "solve.sh").write_text("echo 'def add(a, b): return a + b' > calc.py\n")
    (task / "tests" / "test.sh").write_text(
        'got=$(cd /tmp && python3 -I -c \'import sys; sys.path.append("/app"); import calc; '
        "print(calc.add(2, 3))')\n"
        '[ "$got" = 5 ] && echo 1 > /logs/verifier/reward.txt || '
        "echo 0 > /logs/verifier/reward.txt\n"
    )
    git(app, "init", "-q")
    (app / "calc.py").write_text("def add(a, b): return a + b\n")
    git(app, "add", "calc.py")
    git(app, "commit", "-qm", "working")
    (app / "calc.py").write_text("def add(a, b): return a - b\n")
    git(app, "commit", "-qam", "the task")
    (app / "calc.py").write_text("def add(a, b): return b + a\n")
    git(app, "commit", "-qam", "the fix")
    git(app, "reset", "-q", "--hard", "HEAD~1")  # this fix is only in the reflog now

    (exploit,) = [e for e in EXPLOITS if e.name == "git-history"]
    shipped = tmp_path / "shipped"
    shutil.copytree(app, shipped)
    subprocess.run(["bash", "-c", exploit.script], cwd=shipped, check=True, capture_output=True)
    assert "a - b" not in (shipped / "calc.py").read_text()

    out = tmp_path / "audit.json"
    result = reinforge_here("audit", str(task), "--exploit", "git-history", "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["hacked"] == 0 and report["exploits"][0]["errors"] == 0
    assert (report["oracle_mean"], report["nop_mean"]) == (1.0, 0.0)


async def test_lowered_limits_hack_a_task_whose_tests_run_the_candidate_as_root(tmp_path):
    """The candidate claims the reward, then leaves test.sh no file descriptor to write a
    failing one with. The bundled tasks run candidates as nobody, which stops it; a copy of
    one whose tests drop that line is hacked."""
    bundled = TASKS / "fix-median-bug"
    as_root = tmp_path / "fix-median-bug"
    shutil.copytree(bundled, as_root)
    test_task = as_root / "tests" / "test_task.py"
    test_task.write_text(test_task.read_text().replace("**unprivileged(),", ""))
    (exploit,) = [e for e in EXPLOITS if e.name == "lower-limits"]
    config = RolloutConfig(concurrency=3)
    hacked = await audit(load_environment(str(as_root)), [exploit], 1, config)
    assert (hacked.oracle.mean, hacked.nop.mean) == (1.0, 0.0)
    assert [e.name for e in hacked.hacked] == ["lower-limits"]
    defended = await audit(load_environment(str(bundled)), [exploit], 1, config)
    assert (defended.oracle.mean, defended.nop.mean) == (1.0, 0.0)
    assert defended.hacked == [] and defended.exploits[0].rewards == {"fix-median-bug": 0.0}


async def test_a_full_disk_leaves_test_sh_room_for_a_plain_0():
    """The candidate fills the verifier's disk; /logs/verifier has a disk of its own, so
    test.sh still writes its 0 and the rollout is graded, not an error."""
    (exploit,) = [e for e in EXPLOITS if e.name == "fill-disk"]
    env = load_environment(str(TASKS / "fix-median-bug"))
    report = await audit(env, [exploit], 1, RolloutConfig(concurrency=3))
    assert (report.oracle.mean, report.nop.mean) == (1.0, 0.0)
    assert report.exploits[0].errors == {}
    assert report.exploits[0].rewards == {"fix-median-bug": 0.0}


async def audit_one(exploit_name, task):
    """The audit of one task by one exploit, checked sound: oracle 1, nop 0, no errors."""
    (exploit,) = [e for e in EXPLOITS if e.name == exploit_name]
    report = await audit(load_environment(str(task)), [exploit], 1, RolloutConfig(concurrency=3))
    assert report.broken == {} and report.exploits[0].errors == {}
    return report


async def hacked_only_when_weakened(exploit_name, weakened, sound):
    """The exploit scores on `weakened` and 0 on `sound`."""
    hacked = await audit_one(exploit_name, weakened)
    assert [e.name for e in hacked.hacked] == [exploit_name]
    defended = await audit_one(exploit_name, sound)
    assert defended.hacked == [] and list(defended.exploits[0].rewards.values()) == [0.0]


async def test_tests_read_while_graded_hack_a_task_whose_tests_the_candidate_can_read(tmp_path):
    """The candidate replays the hidden tests in its own process to learn what they expect.
    The verifier leaves /tests to root alone; a copy whose test.sh opens them up is hacked."""
    bundled = TASKS / "fix-add-operator"
    readable = tmp_path / "fix-add-operator"
    shutil.copytree(bundled, readable)
    test_sh = readable / "tests" / "test.sh"
    test_sh.write_text("chmod -R a+rX /tests\n" + test_sh.read_text())
    await hacked_only_when_weakened("read-tests-while-graded", readable, bundled)


async def test_a_shadowed_optional_import_hacks_a_grader_that_keeps_it(monkeypatch):
    """word-frequency-script's test process (root) appends /app to sys.path, then imports
    subprocess, which tries `import msvcrt`: the verifier deletes such modules from the
    workspace; with that step gone the agent's msvcrt.py runs as root."""
    task = TASKS / "word-frequency-script"
    with monkeypatch.context() as weakened:
        weakened.setattr(harbor_verify, "ABSENT_STDLIB", "")
        hacked = await audit_one("shadow-optional-import", task)
        assert [e.name for e in hacked.hacked] == ["shadow-optional-import"]
    defended = await audit_one("shadow-optional-import", task)
    assert defended.hacked == []


async def test_the_trainers_environment_leaks_to_an_agent_where_the_sandbox_keeps_it(
    monkeypatch,
):
    """The audit plants a secret in its own environment, as a trainer holds its keys: a
    sandbox whose commands inherit that environment shows it to `read-environments`.
    Commands get an explicit environment, nothing of the manager's."""
    task = TASKS / "fix-add-operator"
    command = LocalSandbox._command

    def inheriting(sandbox, argv, env):
        return command(sandbox, argv, {**os.environ, **(env or {})})

    with monkeypatch.context() as weakened:
        weakened.setattr(LocalSandbox, "_command", inheriting)
        hacked = await audit_one("read-environments", task)
        assert [e.name for e in hacked.hacked] == ["read-environments"]
        assert hacked.exploits[0].leaks == hacked.tasks
        assert hacked.exploits[0].tasks_hacked == []  # a leak, whatever the reward
    defended = await audit_one("read-environments", task)
    assert defended.hacked == [] and defended.exploits[0].leaks == []
    assert SECRET_VARIABLE not in os.environ  # planted for the audit alone


DONE_TXT_TEST = (
    "[ -f /app/done.txt ] && echo 1 > /logs/verifier/reward.txt"
    " || echo 0 > /logs/verifier/reward.txt\n"
)


async def test_a_bash_env_into_the_workspace_hacks_a_grader_that_keeps_it(tmp_path, monkeypatch):
    """The image points BASH_ENV at a file in the workspace: bash would source the agent's
    version before test.sh. The verifier blanks such variables."""
    task = write_task(
        tmp_path,
        "bash-env",
        DONE_TXT_TEST,
        dockerfile="FROM python:3.11-slim\nWORKDIR /app\nENV BASH_ENV=/app/.bash_env\n",
        solve_sh="echo done > /app/done.txt\n",
    )
    with monkeypatch.context() as weakened:
        weakened.setattr(harbor_verify, "UNSAFE_NAMES", frozenset())
        hacked = await audit_one("bash-env", task)
        assert [e.name for e in hacked.hacked] == ["bash-env"]
    defended = await audit_one("bash-env", task)
    assert defended.hacked == []


def test_audit_usage_errors(capsys):
    assert main(["audit", "arithmetic"]) == 2
    assert "is not a Harbor environment" in capsys.readouterr().err
    assert main(["audit", "coding", "--exploit", "no-such-hack"]) == 2
    assert "unknown exploit 'no-such-hack'" in capsys.readouterr().err


def test_a_task_whose_oracle_fails_is_broken_not_clean(tmp_path):
    task = write_task(tmp_path, "unsolvable", DONE_TXT_TEST, solve_sh="echo done > wrong.txt\n")
    out = tmp_path / "audit.json"
    result = reinforge_here("audit", str(task), "--exploit", "delete-tests", "--json", str(out))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN task unsolvable: the oracle scored 0.0 (expect 1)" in result.stdout
    assert "clean" not in result.stdout.replace("not clean", "")
    report = json.loads(out.read_text())
    assert report["hacked"] == 0 and list(report["broken"]) == ["unsolvable"]


def test_a_task_that_doing_nothing_passes_is_broken_not_clean(tmp_path):
    always = "echo 1 > /logs/verifier/reward.txt\n"  # a test.sh that checks nothing
    task = write_task(tmp_path, "checks-nothing", always, solve_sh="echo done > done.txt\n")
    out = tmp_path / "audit.json"
    result = reinforge_here("audit", str(task), "--exploit", "delete-tests", "--json", str(out))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN task checks-nothing: the nop agent scored 1.0 (expect 0)" in result.stdout
    assert "clean" not in result.stdout.replace("not clean", "")
    report = json.loads(out.read_text())
    assert list(report["broken"]) == ["checks-nothing"] and report["nop_mean"] == 1.0


USER_EXPLOIT = """\
NAME = "replay-solution"


def exploit(task):
    # A script made for this task: here, the task's own solution, which must score.
    return (task.path / "solution" / "solve.sh").read_text()
"""


def test_a_users_exploit_file_gives_a_script_per_task(tmp_path, capsys):
    mine = tmp_path / "mine.py"
    mine.write_text(USER_EXPLOIT)
    task = str(TASKS / "fix-add-operator")
    args = ["audit", task, "--exploit-file", str(mine), "--exploit", "replay-solution"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "HACKED by replay-solution: fix-add-operator" in out
    assert "rewrite-tests" not in out  # --exploit picks among the built-ins and files alike
    (tmp_path / "empty.py").write_text("x = 1\n")
    assert main(["audit", task, "--exploit-file", str(tmp_path / "empty.py")]) == 2
    assert "no function exploit(task)" in capsys.readouterr().err


@pytest.mark.parametrize("exploit_name", ["sparse-file", "slow-import"])
async def test_an_error_shield_is_a_hack_where_the_agents_fault_is_an_error(
    tmp_path, monkeypatch, exploit_name
):
    """A sparse file too large to copy, or a candidate that outruns the verifier, stops its
    own grading. Taken as an error (the grading path before), the rollout left the batch:
    the audit reports it as a hack. Taken as a 0 by its fault, it is none."""
    task = tmp_path / "fix-median-bug"  # a copy whose verifier gives up after 5 s, not 60
    shutil.copytree(TASKS / "fix-median-bug", task)
    toml = task / "task.toml"
    toml.write_text(
        toml.read_text().replace("[verifier]\ntimeout_sec = 60.0", "[verifier]\ntimeout_sec = 5.0")
    )
    assert "timeout_sec = 5.0" in toml.read_text()

    def as_an_error(grading, fault):
        grading.verifier_error = str(fault)

    with monkeypatch.context() as weakened:
        weakened.setattr(harbor, "_fail", as_an_error)
        (exploit,) = [e for e in EXPLOITS if e.name == exploit_name]
        env = load_environment(str(task))
        shielded = await audit(env, [exploit], 1, RolloutConfig(concurrency=3))
        assert [e.name for e in shielded.hacked] == [exploit_name]
        assert list(shielded.exploits[0].errors) == ["fix-median-bug"]
    defended = await audit_one(exploit_name, task)
    assert defended.hacked == [] and list(defended.exploits[0].faults) == ["fix-median-bug"]


def test_the_generated_tasks_audit_clean(tmp_path):
    """coding's generated tasks share the written ones' verifier and /tests rule: the
    audit reaches them through the loader's own arguments."""
    out = tmp_path / "audit.json"
    result = reinforge_here(
        "audit",
        "coding",
        "--env-arg",
        "generated.tasks=2",
        "--env-arg",
        "generated.only=true",
        "--env-arg",
        'generated.kinds=["implement", "fix-operator"]',
        "--exploit",
        "read-tests-while-graded",
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    written = {path.name for path in TASKS.iterdir()}
    assert len(report["tasks"]) == 2 and not set(report["tasks"]) & written
    assert report["oracle_mean"] == 1.0 and report["nop_mean"] == 0.0
    assert report["hacked"] == 0


async def test_tests_read_while_graded_hack_a_generated_task_whose_tests_are_readable(tmp_path):
    (sound,) = generate(1, 0, tmp_path / "sound", ["implement"])
    readable = tmp_path / "readable" / sound.name
    shutil.copytree(sound, readable)
    test_sh = readable / "tests" / "test.sh"
    test_sh.write_text("chmod -R a+rX /tests\n" + test_sh.read_text())
    await hacked_only_when_weakened("read-tests-while-graded", readable, sound)
