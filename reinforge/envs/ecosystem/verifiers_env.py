"""`verifiers:<name>`: an environment written for Prime Intellect's `verifiers` (0.4).

A verifiers environment is a taskset (its tasks, their stop conditions, tools and
rewards), optionally with an `Env` that drives the conversation (a scripted user, a game)
and a harness bundled with it. `<name>` is what verifiers itself resolves: a taskset id
(a built-in such as `textarena`, or an importable module or package exporting its
`Taskset`), or a path to such a module's file or package directory, which this process and
the processes verifiers starts (tool servers) then import as if it were installed.

verifiers plays each rollout as it always does (its harness, its runtime, its tool
servers, its scoring); the model it calls is reinforge's policy, through the rollout's
episode client (`verifiers_client.py` says how the record stays token-exact), and each of
the task's rewards is a term of the rubric with its own name and weight.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

from pydantic import Field

from reinforge.envs.environment import Environment
from reinforge.errors import UsageError
from reinforge.types import Section


class VerifiersArgs(Section):
    """`env.args` of a verifiers environment. Its turn and token limits are `env.max_turns`
    and `env.max_tokens_per_turn`, like every environment's."""

    taskset: dict[str, Any] = Field(default_factory=dict)
    """The taskset's own config, as verifiers' `env.taskset` (a split, a dataset name, a
    `task` table of its task config)."""
    harness: dict[str, Any] | None = None
    """The program that plays the agent, as verifiers' `env.agent.harness` (`{id =
    "bash"}`: a chat loop with a shell); None: the taskset's own, else `null`, verifiers'
    plain chat loop (verifiers' own default is `bash`, but here the runtime's default is
    this machine)."""
    runtime: dict[str, Any] = Field(default_factory=lambda: {"type": "subprocess"})
    """Where the harness runs, as verifiers' `env.agent.runtime`: a local subprocess (the
    default here; verifiers' own default is a Prime sandbox), `docker`, `prime`..."""
    num_tasks: int | None = Field(None, ge=1)
    """The taskset's first `num_tasks` tasks (what verifiers' `-n` takes); None: all of
    them. An infinite taskset needs it."""


def load_environment(name: str, args: VerifiersArgs) -> Environment:
    if find_spec("verifiers") is None:
        raise UsageError(
            "verifiers environments need the verifiers package: pip install 'reinforge[ecosystem]'"
        )
    from reinforge.envs.ecosystem.verifiers_rollout import VerifiersEnvironment

    return VerifiersEnvironment.load(name, args)
