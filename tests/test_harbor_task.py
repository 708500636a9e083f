"""Reading Harbor task directories and the verifier's pieces that need no sandbox."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from reinforge.envs.harbor.task import find_tasks, load_task, parse_dockerfile
from reinforge.envs.harbor.verify import (
    VerifierError,
    filter_workspace,
    neutralise_script,
    parse_reward,
    verifier_env,
)
from reinforge.errors import UsageError


def make_task(root: Path, name: str = "t", toml: str = "", dockerfile: str | None = None) -> Path:
    path = root / name
    (path / "environment").mkdir(parents=True)
    (path / "tests").mkdir()
    (path / "task.toml").write_text(toml)
    (path / "instruction.md").write_text("Do it.\n")
    (path / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    if dockerfile is not None:
        (path / "environment" / "Dockerfile").write_text(dockerfile)
    return path


def test_a_local_dockerfile_becomes_a_replay_plan():
    plan = parse_dockerfile(
        "# comment\nFROM python:3.11-slim\nWORKDIR /app\nENV A=1 B='two words'\n"
        'ENV LEGACY some value\nCOPY a.py b.py src/\nADD ["data", "/app/data"]\n'
        "WORKDIR sub\nCOPY \\\n  c.py .\n"
    )
    assert plan.needs_docker is None
    assert plan.base == "python:3.11-slim" and plan.workdir == "/app/sub"
    assert plan.env == {"A": "1", "B": "two words", "LEGACY": "some value"}
    assert [(c.sources, c.dest, c.workdir) for c in plan.copies] == [
        (("a.py", "b.py"), "src/", "/app"),
        (("data",), "/app/data", "/app"),
        (("c.py",), ".", "/app/sub"),
    ]


@pytest.mark.parametrize(
    ("dockerfile", "reason"),
    [
        ("FROM x\nRUN pip install numpy\n", "RUN at Dockerfile line 2 needs Docker"),
        ("FROM x\nWORKDIR /app\nCOPY --chown=1 a .\n", "COPY --chown=1 a . at Dockerfile"),
        ("FROM x\nADD https://example.com/f /app/f\n", "ADD of a URL at Dockerfile line 2"),
        ("FROM x\nWORKDIR /app\nCOPY a /opt/a\n", "COPY to /opt/a (outside the workdir)"),
        ("FROM x\nWORKDIR /\n", "WORKDIR / cannot be a local sandbox's workdir"),
    ],
)
def test_anything_else_needs_docker_with_a_one_line_reason(dockerfile, reason):
    assert reason in (parse_dockerfile(dockerfile).needs_docker or "")


def test_task_toml_keeps_what_a_sandbox_needs_and_tolerates_the_rest(tmp_path):
    toml = (
        'version = "1.0"\n[metadata]\nauthor_name = "x"\ndifficulty = "easy"\n'
        "[agent]\ntimeout_sec = 30.0\nuser = 'agent'\n"
        "[verifier]\ntimeout_sec = 12.5\nenv = { MODE = 'strict' }\n"
        "[environment]\ncpus = 2\nmemory = '1G'\nstorage_mb = 300\nbuild_timeout_sec = 9\n"
        "[something_new]\nkey = 1\n"
    )
    path = make_task(tmp_path, toml=toml, dockerfile="FROM x\nWORKDIR /srv\n")
    task = load_task(path)
    assert task.config.agent.timeout_sec == 30.0
    assert task.config.verifier.timeout_sec == 12.5
    assert task.config.verifier.env == {"MODE": "strict"}
    resources = task.config.environment
    assert (resources.cpus, resources.memory_mb, resources.storage_mb) == (2, 1024, 300)
    assert task.plan.workdir == "/srv" and task.instruction == "Do it.\n"


def test_task_toml_means_what_harbor_means(tmp_path, monkeypatch):
    """The fields Harbor added or changed since its first schema: the agent's own workdir,
    network policies, env tables with `${VAR}` read from the host, and the canary lines
    that open an instruction, which an agent never sees."""
    monkeypatch.setenv("TASK_TOKEN", "from-host")
    monkeypatch.delenv("TASK_UNSET", raising=False)
    toml = (
        "[agent]\nnetwork_mode = 'no-network'\n"
        "[verifier]\nenv = { TOKEN = '${TASK_TOKEN}', LEVEL = '${TASK_UNSET:-3}' }\n"
        "[solution]\nenv = { TOKEN = 'x${TASK_TOKEN}' }\n"
        "[environment]\nworkdir = '/srv/work/'\nallow_internet = true\n"
        "env = { MODE = 'strict', TOKEN = '${TASK_TOKEN}' }\n"
    )
    dockerfile = "FROM x\nWORKDIR /app\nENV MODE=loose A=1\nCOPY a.py /srv/work/\n"
    path = make_task(tmp_path, toml=toml, dockerfile=dockerfile)
    (path / "environment" / "a.py").write_text("a")
    (path / "instruction.md").write_text(
        "<!-- BENCHMARK DATA. canary GUID 1234 -->\n# harbor-canary GUID 1234\n\nDo it.\n"
    )
    task = load_task(path)
    assert task.instruction == "Do it.\n"
    assert task.workdir == "/srv/work" and task.shipped_paths() == {"/srv/work/a.py"}
    assert task.env == {"MODE": "strict", "A": "1", "TOKEN": "from-host"}
    assert task.config.verifier.env == {"TOKEN": "from-host", "LEVEL": "3"}
    assert task.config.solution.env == {"TOKEN": "x${TASK_TOKEN}"}  # not all a template
    assert task.config.environment.network_mode == "public"  # from allow_internet
    assert not task.config.agent_internet  # the agent phase's own policy wins
    mode = {
        "[environment]\nallow_internet = false\n": False,
        "[environment]\nallow_internet = false\nnetwork_mode = 'public'\n": True,
        "[environment]\nnetwork_mode = 'allowlist'\nallowed_hosts = ['pypi.org']\n": False,
        "[environment]\nnetwork_mode = 'no-network'\n[agent]\nnetwork_mode = 'public'\n": True,
        "": True,
    }
    for i, (toml, internet) in enumerate(mode.items()):
        assert (
            load_task(make_task(tmp_path, f"net{i}", toml=toml)).config.agent_internet == internet
        )


@pytest.mark.parametrize(
    ("toml", "error"),
    [
        ("[environment]\nmemory = '1G'\nmemory_mb = 2048\n", "is 1024 MB but memory_mb"),
        ("[environment]\nstorage = '4GB'\n", "expected a number with G, M or K"),
        ("[environment]\nworkdir = 'app'\n", "not an absolute path"),
        ("[environment]\nnetwork_mode = 'open'\n", "network_mode"),
        ("[environment]\nos = 'windows'\n", "os = 'windows'; tasks run on Linux"),
        ("[[steps]]\nname = 'one'\n", r"multi-step tasks \(\[\[steps\]\]\) are not supported"),
        ("[verifier]\nenv = { KEY = '${TASK_UNSET}' }\n", r"\[verifier\] env KEY = .*not set"),
    ],
)
def test_task_toml_that_harbor_refuses_is_refused_in_one_line(tmp_path, monkeypatch, toml, error):
    monkeypatch.delenv("TASK_UNSET", raising=False)
    with pytest.raises(UsageError, match=error):
        load_task(make_task(tmp_path, toml=toml, dockerfile="FROM x\n"))


def test_bad_task_dirs_are_usage_errors_naming_the_file(tmp_path):
    bad_toml = make_task(tmp_path, "bad", toml="[agent\n")
    with pytest.raises(UsageError, match="bad/task.toml"):
        load_task(bad_toml)
    no_instruction = make_task(tmp_path, "noinstr")
    (no_instruction / "instruction.md").unlink()
    with pytest.raises(UsageError, match="no instruction.md"):
        load_task(no_instruction)
    dockerfile = "FROM x\nWORKDIR /app\nCOPY gone.py .\n"
    missing_copy = make_task(tmp_path, "nocopy", dockerfile=dockerfile)
    with pytest.raises(UsageError, match="COPY gone.py"):
        load_task(missing_copy)
    with pytest.raises(UsageError, match="no task.toml"):
        find_tasks(tmp_path / "bad" / "tests")


def test_a_folder_of_task_dirs_is_read_in_name_order(tmp_path):
    for name in ("b", "a"):
        make_task(tmp_path, name, dockerfile="FROM x\n")
    (tmp_path / "not-a-task").mkdir()
    assert [t.name for t in find_tasks(tmp_path)] == ["a", "b"]
    assert [t.name for t in find_tasks(tmp_path / "a")] == ["a"]


def test_the_environment_tar_places_copies_where_docker_would(tmp_path):
    path = make_task(
        tmp_path,
        dockerfile=(
            "FROM x\nWORKDIR /app\nCOPY one.py .\nCOPY pkg lib/\nCOPY one.py two.py /tmp/d/\n"
        ),
    )
    (path / "environment" / "one.py").write_text("1")
    (path / "environment" / "two.py").write_text("2")
    (path / "environment" / "pkg" / "sub").mkdir(parents=True)
    (path / "environment" / "pkg" / "sub" / "m.py").write_text("m")
    task = load_task(path)
    assert task.shipped_paths() == {
        "/app/one.py",
        "/app/lib/sub/m.py",
        "/tmp/d/one.py",
        "/tmp/d/two.py",
    }


def git(repo: Path, *args: str) -> str:
    identity = ("-c", "user.name=t", "-c", "user.email=t@example.invalid")
    done = subprocess.run(
        ["git", *identity, *args], cwd=repo, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def history_repo(repo: Path) -> str:
    """A repository whose history holds the fix everywhere but in HEAD: an earlier commit,
    the reflog, a tag, a branch, a stash, a dangling blob. Returns HEAD's hash."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text("def add(a, b): return a + b\n")
    git(repo, "add", "calc.py")
    git(repo, "commit", "-qm", "working")
    (repo / "calc.py").write_text("def add(a, b): return a - b\n")
    git(repo, "commit", "-qam", "the task")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "calc.py").write_text("def add(a, b): return b + a\n")
    git(repo, "commit", "-qam", "the fix")
    git(repo, "tag", "fixed")
    git(repo, "branch", "solution")
    git(repo, "reset", "-q", "--hard", base)
    git(repo, "gc", "-q")
    (repo / "calc.py").write_text("def add(a, b): return a + b  # stashed\n")
    git(repo, "stash", "-q")
    subprocess.run(
        ["git", "hash-object", "-w", "--stdin"], cwd=repo, input=b"fix", capture_output=True
    )
    (repo / "notes.txt").write_text("untracked\n")
    return base


def test_a_shipped_git_repository_keeps_its_base_commit_and_nothing_else(tmp_path):
    path = make_task(
        tmp_path,
        dockerfile="FROM x\nWORKDIR /app\nCOPY repo .\nCOPY other/.git /tmp/other/.git\n",
    )
    repo = path / "environment" / "repo"
    base = history_repo(repo)
    history_repo(path / "environment" / "other")
    out = tmp_path / "sandbox"
    with tarfile.open(fileobj=io.BytesIO(load_task(path).environment_tar())) as tar:
        tar.extractall(out, filter="data")
    app = out / "app"
    assert git(app, "log", "--all", "--format=%H") == base
    assert git(app, "rev-parse", "HEAD^{tree}") == git(repo, "rev-parse", "HEAD^{tree}")
    assert git(app, "for-each-ref", "--format=%(refname)") == "refs/heads/main"
    assert git(app, "symbolic-ref", "HEAD") == "refs/heads/main"
    assert git(app, "reflog") == "" and git(app, "stash", "list") == ""
    objects = git(app, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)")
    names = git(repo, "rev-list", "--objects", "--no-walk", base).split("\n")
    assert sorted(objects.split()) == sorted(line.split()[0] for line in names)
    assert git(app, "status", "--porcelain") == "?? notes.txt"
    git(app, "fsck", "--strict")
    assert git(out / "tmp" / "other", "rev-list", "--all").count("\n") == 0


def test_a_bare_repository_keeps_its_base_commit_and_a_bundle_is_refused(tmp_path):
    path = make_task(tmp_path, dockerfile="FROM x\nWORKDIR /app\nCOPY stuff .\n")
    work = tmp_path / "work"
    base = history_repo(work)
    stuff = path / "environment" / "stuff"
    stuff.mkdir()
    git(tmp_path, "clone", "-q", "--bare", str(work), str(stuff / "origin.git"))
    (stuff / "readme.txt").write_text("plain\n")
    out = tmp_path / "sandbox"
    with tarfile.open(fileobj=io.BytesIO(load_task(path).environment_tar())) as tar:
        tar.extractall(out, filter="data")
    bare = out / "app" / "origin.git"
    assert git(bare, "--git-dir=.", "log", "--all", "--format=%H") == base
    assert git(bare, "--git-dir=.", "rev-parse", "--is-bare-repository") == "true"
    git(bare, "--git-dir=.", "fsck", "--strict")
    assert (out / "app" / "readme.txt").read_text() == "plain\n"
    git(work, "bundle", "create", "-q", str(stuff / "all.bundle"), "--all")
    with pytest.raises(UsageError, match="all.bundle: a git bundle carries"):
        load_task(path)


def test_a_shipped_repository_without_commits_stays_empty(tmp_path):
    path = make_task(tmp_path, dockerfile="FROM x\nWORKDIR /app\nCOPY repo .\n")
    repo = path / "environment" / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "trunk")
    (repo / "a.py").write_text("a = 1\n")
    out = tmp_path / "sandbox"
    with tarfile.open(fileobj=io.BytesIO(load_task(path).environment_tar())) as tar:
        tar.extractall(out, filter="data")
    assert (
        git(out / "app", "status", "--porcelain", "--branch")
        == "## No commits yet on trunk\n?? a.py"
    )


def test_reward_files_are_read_as_harbor_reads_them():
    assert parse_reward(b"0.75\n", None) == (0.75, {})
    assert parse_reward(None, b'{"reward": 0.5, "style": 1}') == (0.5, {"reward": 0.5, "style": 1})
    assert parse_reward(None, b'{"a": 1, "b": 0}') == (0.5, {"a": 1.0, "b": 0.0})
    assert parse_reward(b"0\n", b'{"reward": 1}') == (1.0, {"reward": 1.0})  # json wins
    assert parse_reward(None, None) == (None, {})
    refused = [
        (b"passed", None),
        (b"nan", None),
        (b"inf\n", None),
        (None, b"1"),  # Harbor's rewards are a {name: number} object
        (None, b"[1]"),
        (None, b"{}"),
        (None, b"{"),
        (None, b'{"reward": "1"}'),
        (None, b'{"reward": NaN}'),
        (None, b'{"reward": 1e999}'),
    ]
    for text, data in refused:
        with pytest.raises(VerifierError):
            parse_reward(text, data)


def tar_of(*members: tarfile.TarInfo, data: bytes = b"x") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for member in members:
            if member.isfile():
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
            else:
                tar.addfile(member)
    return out.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def test_only_the_workspace_crosses_to_the_verifier():
    raw = tar_of(
        member("app", tarfile.DIRTYPE),
        member("app/ok.py"),
        member("app/inner", tarfile.SYMTYPE, "ok.py"),
        member("app/here", tarfile.SYMTYPE, "."),
        member("app/via-here", tarfile.SYMTYPE, "here/here/ok.py"),
        # Read lexically these stay inside; followed through `here` they reach / and ../.
        member("app/chain", tarfile.SYMTYPE, "here/here/here/../../.."),
        member("app/sub", tarfile.DIRTYPE),
        member("app/sub/chain", tarfile.SYMTYPE, "../here/.."),
        member("app/loop", tarfile.SYMTYPE, "loop/x"),
        member("app/up", tarfile.SYMTYPE, "../logs/verifier/reward.txt"),
        member("app/abs", tarfile.SYMTYPE, "/tests/test.sh"),
        member("app/hard", tarfile.LNKTYPE, "app/ok.py"),
        member("app/dev", tarfile.CHRTYPE),
        member("app/../logs/verifier/reward.txt"),
        member("/tests/test.sh"),
        member("other/file"),
    )
    with tarfile.open(fileobj=io.BytesIO(filter_workspace(raw, "/app"))) as tar:
        kept = ["app", "app/here", "app/inner", "app/ok.py", "app/sub", "app/via-here"]
        assert sorted(tar.getnames()) == kept


def test_the_verifier_env_drops_what_could_redirect_python(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    image_env = {"PYTHONPATH": "/app", "LANG": "C", "LD_PRELOAD": "x", "APP_DIR": "/app"}
    image_env |= {"BASH_ENV": "/app/.env.sh", "ENV": "/app/.profile", "NODE_OPTIONS": "-r x"}
    image_env["PATH"] = "/app/bin:/opt/venv/bin:relative:/usr/bin"
    env = verifier_env({"MODE": "strict"}, image_env, tests, "/app")
    assert (
        env["PATH"] == "/opt/venv/bin:/usr/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/sbin:/bin"
    )
    assert env["PYTHONPATH"] == "" and env["LD_PRELOAD"] == ""  # blanked: an image has them
    assert env["BASH_ENV"] == env["ENV"] == env["NODE_OPTIONS"] == ""
    assert env["LANG"] == "C" and env["MODE"] == "strict" and env["APP_DIR"] == "/app"
    assert env["PYTHONNOUSERSITE"] == "1" and "PYTHONSAFEPATH" not in env
    assert "-c /dev/null --rootdir=/tests" in env["PYTEST_ADDOPTS"]
    (tests / "pytest.ini").write_text("[pytest]\n")
    assert "-c /tests/pytest.ini" in verifier_env({}, {}, tests, "/app")["PYTEST_ADDOPTS"]


PLANTED_CONFTEST = """
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
"""


@pytest.mark.parametrize("plant", ["conftest", "ini", "shadow"])
def test_planted_pytest_hacks_pass_plainly_and_fail_once_neutralised(tmp_path, plant):
    """The host's pytest stands in for a verifier's: each plant makes a failing test pass
    until `neutralise_script` and `verifier_env` are applied."""
    app, tests = tmp_path / "app", tmp_path / "tests"
    app.mkdir()
    tests.mkdir()
    (app / "test_visible.py").write_text("def test_fails():\n    assert False\n")
    if plant == "conftest":
        (app / "conftest.py").write_text(PLANTED_CONFTEST)
    elif plant == "ini":
        (app / "pytest.ini").write_text("[pytest]\naddopts = --collect-only\n")
    else:
        (app / "pytest.py").write_text("raise SystemExit(0)\n")
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    hacked = subprocess.run(argv, cwd=app, env=base, capture_output=True, timeout=120)
    assert hacked.returncode == 0, hacked.stdout
    subprocess.run(["sh", "-c", neutralise_script(str(app), set())], check=True, timeout=60)
    env = base | verifier_env({}, {}, tests, str(app), tests_path=str(tests))
    graded = subprocess.run(argv, cwd=app, env=env, capture_output=True, timeout=120)
    assert graded.returncode == 1, graded.stdout
