"""A verifiers environment as a reinforge `Environment`: its tasks, its rollouts, its rewards.

Each rollout is one verifiers episode of the task, run the way verifiers runs it, with
reinforge's episode client as the model (`verifiers_client.py`). What verifiers scored
becomes the rubric's terms: each of the task's rewards (and judges) under its own name
and weight, so the total is the one verifiers computes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import verifiers.v1 as vf
from pydantic import ValidationError
from verifiers.v1.dialects.chat import message_to_wire

from reinforge.envs.ecosystem.verifiers_client import Conversation, policy_route
from reinforge.envs.ecosystem.verifiers_env import VerifiersArgs
from reinforge.envs.environment import Environment, Harness
from reinforge.envs.episode import Episode
from reinforge.envs.rubric import Reward, Rubric
from reinforge.errors import ConfigError, UsageError
from reinforge.policy.client import ChatClient, EpisodeMisuse
from reinforge.types import Message, Task

TASK_DATA = "verifiers_task"
"""The key of `Task.info` that holds the verifiers task's data, from which a rollout
builds the task again, as verifiers' own environment server does."""
POLICY_MODEL = "policy"
"""The model name verifiers' harnesses send: whatever it is, the policy answers."""


class VerifiersError(Exception):
    """The verifiers episode failed (its harness, a tool server, its scoring)."""


@dataclass(frozen=True)
class VerifiersRun:
    """What a finished verifiers episode left for the rubric and the trajectory."""

    rewards: dict[str, float]
    tools: list[dict[str, Any]] | None


class VerifiersEnvironment(Environment):
    def __init__(self, name: str, env: vf.Env, tasks: list[vf.Task]) -> None:
        self.terms = reward_terms(tasks[0])
        rubric = Rubric(
            *(Reward(_recorded(key), weight, name=key) for key, weight in self.terms.items())
        )
        # the harness's own limits; `env.max_turns` and `env.max_tokens_per_turn` change them
        super().__init__(Harness(max_turns=20, max_tokens_per_turn=1024), rubric)
        self.name = name
        self.env = env
        self.pool = tasks
        self.served = Served(env)

    @classmethod
    def load(cls, name: str, args: VerifiersArgs) -> VerifiersEnvironment:
        taskset_id = _importable(name)
        try:
            roles = _roles(vf.env_config_type(taskset_id))
            harness = args.harness or {"id": _default_harness(taskset_id)}
            agent = {"runtime": args.runtime, "harness": harness}
            config = vf.resolve_env_config(
                {"taskset": {**args.taskset, "id": taskset_id}} | dict.fromkeys(roles, agent)
            )
            env = vf.load_environment(config)
        except ModuleNotFoundError as error:
            raise UsageError(f"verifiers: {error}") from error
        except ValidationError as error:
            where, problem = _config_problem(error)
            raise ConfigError(where, problem) from error
        taskset = env.taskset if args.num_tasks is None else env.taskset.take(args.num_tasks)
        if not taskset.bounded:
            raise UsageError(f"taskset {taskset_id!r} never ends: set env.args.num_tasks")
        tasks = list(taskset)
        if not tasks:
            raise UsageError(f"taskset {taskset_id!r} has no tasks")
        return cls(f"verifiers:{name}", env, tasks)

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        """Every task when `n` covers them (cycling past that), else a seeded sample."""
        count = len(self.pool)
        chosen = (
            random.Random(seed).sample(range(count), n)
            if n < count
            else [i % count for i in range(n)]
        )
        return [self._task(self.pool[j], i) for i, j in enumerate(chosen)]

    def _task(self, task: vf.Task, index: int) -> Task:
        data = task.data
        name = data.id or str(data.idx)
        return Task(
            id=name if index < len(self.pool) else f"{name}#{index}",
            prompt=_prompt(data),
            info={TASK_DATA: data.model_dump(mode="json")},
        )

    def verifiers_task(self, task: Task) -> vf.Task:
        task_type = type(self.env.taskset).task_type()
        data = task_type.data_type().model_validate(task.info[TASK_DATA])
        return task_type(data, self.env.config.taskset.task)

    def request_tools(self, episode: Episode) -> list[dict[str, Any]] | None:
        """The tools of the policy's last call, which the harness chose: known once the
        episode has run."""
        run = episode.extras.get(VerifiersRun)
        return run.tools if run is not None else None

    async def _play(self, client: ChatClient, episode: Episode) -> None:
        harness = self.harness
        conversation = Conversation(client, harness.max_turns, harness.max_tokens_per_turn)
        await self.served.ready()
        with policy_route(conversation) as policy:
            context = vf.ModelContext(model=POLICY_MODEL, client=policy)
            (slot,) = self.env.slots(self.verifiers_task(episode.task))
            result = await self.env.run_slot(slot, context)
        episode.messages = conversation.messages
        episode.turns = conversation.turns
        episode.tool_calls = conversation.tool_calls
        if conversation.refusal is not None:
            raise EpisodeMisuse(conversation.refusal)
        if not result.ok:
            raise VerifiersError(_failure(result))
        if len(result.traces) != 1:
            raise VerifiersError(
                f"the episode played {len(result.traces)} agent runs; reinforge trains on "
                "environments that play one"
            )
        (trace,) = result.traces
        episode.truncated = conversation.truncated or trace.is_truncated
        episode.extras[VerifiersRun] = VerifiersRun(self._rewards(trace), conversation.tools)
        episode.state["verifiers"] = {
            "trace_id": trace.id,
            "stop_condition": trace.stop_condition,
            "metrics": dict(trace.metrics),
        }

    async def aclose(self) -> None:
        await self.served.close()

    def _rewards(self, trace: vf.Trace) -> dict[str, float]:
        """The trace's rewards, which must be the terms found when the environment loaded."""
        rewards = {name: r.score for name, r in trace.rewards.items() if r is not None}
        unknown = sorted(set(trace.rewards) - set(self.terms))
        if unknown:
            raise VerifiersError(
                f"rewards {unknown} were not among the task's rewards when the environment "
                f"loaded ({sorted(self.terms)}): reinforge needs each reward named up front"
            )
        unscored = sorted(set(self.terms) - set(rewards))
        if unscored:
            raise VerifiersError(f"verifiers did not score {unscored}")
        return rewards


class Served:
    """verifiers' serving resources (its interception server, the taskset's shared tool
    servers), up once for all of a run's rollouts, as verifiers runs them: `env.serving()`
    held open by a task of the rollouts' event loop, since a context is left in the task
    that entered it."""

    def __init__(self, env: vf.Env) -> None:
        self.env = env
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._up: asyncio.Future[None] | None = None
        self._stop = asyncio.Event()

    async def ready(self) -> None:
        """Once they are up on this loop; a start that failed is tried again."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._task is None or self._task.done():
            self._loop, self._up, self._stop = loop, loop.create_future(), asyncio.Event()
            self._task = loop.create_task(self._hold(self._up, self._stop))
        assert self._up is not None
        await asyncio.shield(self._up)

    async def _hold(self, up: asyncio.Future[None], stop: asyncio.Event) -> None:
        try:
            async with self.env.serving():
                up.set_result(None)
                await stop.wait()
        except BaseException as error:
            if not up.done():
                up.set_exception(error)
            raise

    async def close(self) -> None:
        if self._task is None or self._loop is not asyncio.get_running_loop():
            return
        self._stop.set()
        with contextlib.suppress(Exception):
            await self._task
        self._task = None


def reward_terms(task: vf.Task) -> dict[str, float]:
    """Each reward of `task` (its `@vf.reward` methods, the ones its config plugs in, its
    judges) and its weight, as verifiers weighs it when it scores."""
    terms = {fn.__name__: getattr(fn, "_vf_weight", 1.0) for fn in task.hooks("reward")}
    terms |= {judge.reward_name: judge.config.weight for judge in task.plugged_judges()}
    return terms


def _recorded(name: str) -> Any:
    def reward(episode: Episode) -> float:
        return episode.extras[VerifiersRun].rewards[name]

    reward.__name__ = name
    return reward


def _importable(name: str) -> str:
    """The taskset id of `name`: itself, or for a module's file or a package's directory
    the module's name, its parent directory put first on the import path of this process
    and of the subprocesses verifiers starts."""
    path = Path(name)
    if not (name.endswith(".py") or path.is_dir()):
        return name
    if not path.exists():
        raise UsageError(f"no verifiers environment at {name}")
    parent = str(path.resolve().parent)
    if parent not in sys.path:
        sys.path.insert(0, parent)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [parent, *filter(None, [os.environ.get("PYTHONPATH")])]
        )
    return path.stem if path.is_file() else path.name


def _default_harness(taskset_id: str) -> str:
    """The taskset's own harness, else verifiers' plain chat loop: verifiers' default,
    `bash`, offers the model a shell, and the default runtime here is this machine."""
    bundled = vf.default_harness_id(taskset_id)
    return "null" if bundled == "bash" else bundled


def _roles(config_type: type[vf.EnvConfig]) -> list[str]:
    """The agent seats of an environment's config."""
    return [
        name
        for name, field in config_type.model_fields.items()
        if isinstance(field.default, vf.AgentConfig)
    ]


def _config_problem(error: ValidationError) -> tuple[str, str]:
    """Where in `env.args` a verifiers config problem is, and what it is."""
    first = error.errors()[0]
    parts = [str(part) for part in first["loc"]]
    if parts and parts[0] != "taskset":  # an agent seat: its keys are env.args' own
        parts = parts[1:]
    problem = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
    return ".".join(["env.args", *parts]), problem


def _prompt(data: vf.TaskData) -> list[Message]:
    """The task's prompt as chat messages, for readers: the harness builds its own."""
    messages: list[Message] = []
    if data.system_prompt is not None:
        messages.append({"role": "system", "content": data.system_prompt})
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    elif data.prompt:
        messages += [message_to_wire(m) for m in data.prompt]
    return messages


def _failure(result: vf.Episode) -> str:
    errors = [*result.errors, *(e for trace in result.traces for e in trace.errors)]
    if not errors:
        return "the episode did not finish"
    last = errors[-1]
    return f"{last.type}: {last.message}"
