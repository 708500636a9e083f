"""Run by the `harbor` package's interpreter (Python >= 3.12): read each task directory named
on the command line with Harbor's own task model and print, as one JSON object keyed by
path, what Harbor makes of each field reinforge reads, or the error Harbor refuses it with.
Values Harbor resolves only at run time (`${VAR}` templates in env tables) are resolved
here the way Harbor's runner resolves them, so the two readings compare as run."""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

from harbor.models.task.config import NetworkMode
from harbor.models.task.task import Task
from harbor.utils.env import resolve_env_vars


def resolved(env: dict[str, str]) -> dict[str, str] | str:
    try:
        return resolve_env_vars(env)
    except ValueError as error:
        return f"error: {error}"


def read(path: str) -> dict[str, Any]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            task = Task(path)
    except Exception as error:  # Harbor refuses the task: its reason, for the report
        return {"error": f"{type(error).__name__}: {error}"}
    config = task.config
    environment = config.environment
    agent_policy = config.agent.explicit_phase_policy() or environment.resolve_baseline()
    test = task.paths.discovered_test_path_for(environment.os)
    solve = task.paths.discovered_solve_path_for(environment.os)
    return {
        "name": task.name,
        "instruction": task.instruction,
        "agent_timeout_sec": config.agent.timeout_sec,
        "verifier_timeout_sec": config.verifier.timeout_sec,
        "verifier_env": resolved(config.verifier.env),
        "solution_env": resolved(config.solution.env),
        "environment_env": resolved(environment.env),
        "cpus": environment.cpus,
        "memory_mb": environment.memory_mb,
        "storage_mb": environment.storage_mb,
        "agent_public_network": agent_policy.network_mode == NetworkMode.PUBLIC,
        "workdir": environment.workdir,
        "os": environment.os.value,
        "docker_image": environment.docker_image,
        "metadata": config.metadata,
        "test_script": str(test) if test else None,
        "solve_script": str(solve) if solve else None,
    }


if __name__ == "__main__":
    print(json.dumps({path: read(path) for path in sys.argv[1:]}))
