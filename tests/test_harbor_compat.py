"""reinforge reads a Harbor task as the `harbor` package itself reads it.

`harbor` needs Python >= 3.12, so its task model runs in an interpreter of its own, named by
REINFORGE_HARBOR_PYTHON (a Python with `harbor` installed; CI makes one), where
`tests/data/harbor_parse.py` prints what Harbor read. Every bundled task, the example and a
set of edge cases are read by both sides and each field reinforge uses is compared. Without
that interpreter the tests skip; CI sets REINFORGE_REQUIRE_EXTRAS=1, and there they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from reinforge.envs.builtin.coding import TASKS
from reinforge.envs.harbor.task import load_task
from reinforge.envs.harbor.task_config import EnvironmentSection
from reinforge.errors import UsageError

HARBOR_PARSE = Path(__file__).parent / "data" / "harbor_parse.py"
EXAMPLE = Path(__file__).parent.parent / "examples" / "weak_task"
BUNDLED = sorted(p for p in TASKS.iterdir() if (p / "task.toml").is_file())
INSTRUCTION = "Make `/app/x.py` print 1.\n"
ENV_TABLES = (
    "[verifier]\nenv = { TOKEN = '${COMPAT_TOKEN}', LEVEL = '${COMPAT_UNSET:-3}' }\n"
    "[solution]\nenv = { TOKEN = 'x${COMPAT_TOKEN}', PLAIN = 'p' }\n"
    "[environment]\nenv = { MODE = 'strict', TOKEN = '${COMPAT_TOKEN}' }\n"
)
EDGE_CASES: dict[str, tuple[str, str]] = {
    # name: (task.toml, instruction.md)
    "defaults": ("", INSTRUCTION),
    "timeouts": ("[agent]\ntimeout_sec = 30\n[verifier]\ntimeout_sec = 12.5\n", INSTRUCTION),
    "canary": (
        "",
        "<!-- BENCHMARK DATA. canary GUID 12ab -->\n# harbor-canary 12ab\n\n" + INSTRUCTION,
    ),
    "leading-blank-lines": ("", "\n\n" + INSTRUCTION),
    "canary-later-is-kept": ("", INSTRUCTION + "<!-- canary GUID 12ab -->\n"),
    "resources": ("[environment]\ncpus = 0.5\nmemory_mb = 700\nstorage_mb = 300\n", INSTRUCTION),
    "whole-float-cpus": ("[environment]\ncpus = 2.0\n", INSTRUCTION),
    "legacy-sizes": ("[environment]\nmemory = '1.5G'\nstorage = '3072K'\n", INSTRUCTION),
    "legacy-size-agrees": ("[environment]\nmemory = '1G'\nmemory_mb = 1024\n", INSTRUCTION),
    "legacy-size-conflict": ("[environment]\nmemory = '1G'\nmemory_mb = 2048\n", INSTRUCTION),
    "size-with-b": ("[environment]\nstorage = '4GB'\n", INSTRUCTION),
    "internet-off-legacy": ("[environment]\nallow_internet = false\n", INSTRUCTION),
    "network-mode-wins": (
        "[environment]\nallow_internet = false\nnetwork_mode = 'public'\n",
        INSTRUCTION,
    ),
    "no-network": ("[environment]\nnetwork_mode = 'no-network'\n", INSTRUCTION),
    "allowlist": (
        "[environment]\nnetwork_mode = 'allowlist'\nallowed_hosts = ['pypi.org']\n",
        INSTRUCTION,
    ),
    "agent-network-override": (
        "[environment]\nnetwork_mode = 'no-network'\n[agent]\nnetwork_mode = 'public'\n",
        INSTRUCTION,
    ),
    "bad-network-mode": ("[environment]\nnetwork_mode = 'open'\n", INSTRUCTION),
    "workdir": ("[environment]\nworkdir = '/srv/work'\n", INSTRUCTION),
    "env-tables": (ENV_TABLES, INSTRUCTION),
    "env-unset": ("[verifier]\nenv = { KEY = '${COMPAT_UNSET}' }\n", INSTRUCTION),
    "metadata-and-unknown-keys": (
        'schema_version = "1.4"\nsource = "x"\n[metadata]\ndifficulty = "hard"\n'
        "tags = ['a']\n[agent]\nuser = 'agent'\n[verifier]\nuser = 1000\n"
        "[environment]\nbuild_timeout_sec = 9.0\ngpus = 0\n",
        INSTRUCTION,
    ),
    "package-name": ('[task]\nname = "org/pkg"\n', INSTRUCTION),
    "relative-workdir": ("[environment]\nworkdir = 'app'\n", INSTRUCTION),
    "prebuilt-image": ("[environment]\ndocker_image = 'org/image:1'\n", INSTRUCTION),
    "prebuilt-image-alone": ("[environment]\ndocker_image = 'org/image:1'\n", INSTRUCTION),
}
REINFORGE_REFUSES = {
    "relative-workdir": "not an absolute path",  # Harbor takes it, and fails running it
}
"""Edge cases Harbor reads and reinforge refuses, with the reason it gives."""
NAMED_BY_DIRECTORY = {"package-name"}
WITHOUT_ENVIRONMENT_DIR = {"prebuilt-image-alone"}
"""A prebuilt image makes `environment/` optional."""
"""Harbor names a task by its `[task] name`; reinforge by its directory, always."""


def harbor_python() -> str:
    python = os.environ.get("REINFORGE_HARBOR_PYTHON")
    if python:
        return python
    if os.environ.get("REINFORGE_REQUIRE_EXTRAS"):
        pytest.fail("REINFORGE_REQUIRE_EXTRAS is set but REINFORGE_HARBOR_PYTHON is not")
    pytest.skip("REINFORGE_HARBOR_PYTHON (a Python >= 3.12 with `harbor`) is not set")


def write_edge_case(root: Path, name: str) -> Path:
    toml, instruction = EDGE_CASES[name]
    path = root / name
    for sub in ("environment", "tests", "solution"):
        (path / sub).mkdir(parents=True)
    (path / "task.toml").write_text(toml)
    (path / "instruction.md").write_text(instruction)
    (path / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    (path / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (path / "solution" / "solve.sh").write_text("echo 'print(1)' > /app/x.py\n")
    if name in WITHOUT_ENVIRONMENT_DIR:
        shutil.rmtree(path / "environment")
    return path


@pytest.fixture(scope="module")
def host_env() -> Any:
    """The host variables the env tables' templates read, for both sides alike."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COMPAT_TOKEN", "from-host")
        patch.delenv("COMPAT_UNSET", raising=False)
        yield


@pytest.fixture(scope="module")
def edge_cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("edge")
    return {name: write_edge_case(root, name) for name in EDGE_CASES}


@pytest.fixture(scope="module")
def harbor(edge_cases: dict[str, Path], host_env: None) -> dict[str, dict[str, Any]]:
    """What Harbor reads in every task, by path: one interpreter start for them all."""
    paths = [*BUNDLED, EXAMPLE, *edge_cases.values()]
    done = subprocess.run(
        [harbor_python(), str(HARBOR_PARSE), *map(str, paths)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def reinforge_reading(path: Path) -> dict[str, Any]:
    """The same fields as `harbor_parse.py` prints, as reinforge reads and uses them."""
    try:
        task = load_task(path)
    except UsageError as error:
        return {"error": str(error)}
    config = task.config
    environment = config.environment
    return {
        "name": task.name,
        "instruction": task.instruction,
        "agent_timeout_sec": config.agent.timeout_sec,
        "verifier_timeout_sec": config.verifier.timeout_sec,
        "verifier_env": config.verifier.env,
        "solution_env": config.solution.env,
        "environment_env": environment.env,
        "cpus": environment.cpus,
        "memory_mb": environment.memory_mb,
        "storage_mb": environment.storage_mb,
        "agent_public_network": config.agent_internet,
        "workdir": environment.workdir,
        "os": environment.os,
        "docker_image": environment.docker_image,
        "metadata": config.metadata,
        "test_script": str(task.tests_dir / "test.sh"),
        "solve_script": str(task.solution_dir / "solve.sh"),
    }


def assert_same_reading(harbor: dict[str, Any], path: Path) -> None:
    ours = reinforge_reading(path)
    assert "error" not in harbor, harbor["error"]
    assert "error" not in ours, ours["error"]
    for resource in ("cpus", "memory_mb", "storage_mb"):
        if harbor[resource] is None:  # Harbor sets no limit; a sandbox always has one
            harbor[resource] = EnvironmentSection.model_fields[resource].default
    if path.name in NAMED_BY_DIRECTORY:
        assert (harbor["name"], ours["name"]) == ("org/pkg", path.name)
        harbor["name"] = ours["name"]
    differing = {key: (harbor[key], ours[key]) for key in ours if harbor[key] != ours[key]}
    assert not differing, f"{path.name}: (harbor, reinforge) differ: {differing}"
    if ours["workdir"]:
        assert load_task(path).workdir == ours["workdir"]  # over the Dockerfile's WORKDIR


@pytest.mark.parametrize("path", [*BUNDLED, EXAMPLE], ids=lambda p: p.name)
def test_every_bundled_task_reads_as_harbor_reads_it(harbor, path):
    assert_same_reading(harbor[str(path)], path)


@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_edge_cases_read_as_harbor_reads_them(harbor, edge_cases, name):
    """Harbor and reinforge agree on every field, or both refuse the task (reinforge's
    refusals of tasks Harbor takes are listed in REINFORGE_REFUSES, with their reason)."""
    path = edge_cases[name]
    theirs = harbor[str(path)]
    if name in REINFORGE_REFUSES:
        assert "error" not in theirs
        assert REINFORGE_REFUSES[name] in reinforge_reading(path)["error"]
        return
    env_errors = [v for k, v in theirs.items() if k.endswith("_env") and isinstance(v, str)]
    if "error" in theirs or env_errors:  # Harbor refuses it, at load or when it runs
        assert "error" in reinforge_reading(path), (theirs.get("error"), env_errors)
        return
    assert_same_reading(theirs, path)
