"""Harbor task directories as an environment: one task dir, or a folder of them.

Each episode gets a sandbox set up from the task's `environment/` (see `task.py`): a
local one where the Dockerfile can be replayed, else a container of the task's image on
Docker. The instruction is its prompt, and it gets an agent: the model with the sandbox
tools (`bash`, `read_file`, `write_file`, `edit`), or a scripted agent for task authors
(`agents.py`): `oracle` runs `solution/solve.sh`, `nop` does nothing, and a
`ScriptAgent` runs its own shell script (the exploits of `reinforge audit`). All are
graded the same way, by the task's `tests/test.sh` in a fresh sandbox after the agent
phase (see `verify.py`), which the episode keeps as its `Grading`.
"""

from __future__ import annotations

import asyncio
import random
import sys
import zlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal, get_args

from pydantic import Field

from reinforge.envs.environment import Environment, Harness
from reinforge.envs.episode import Episode
from reinforge.envs.harbor.agents import (
    OUTPUT_CHARS,
    SOLUTION_DIR,
    ScriptAgent,
    play_oracle,
    play_script,
)
from reinforge.envs.harbor.grading import Grading
from reinforge.envs.harbor.hacks import hack_flags
from reinforge.envs.harbor.sandbox import SANDBOX, TOOL_NAMES, SandboxTools, ToolName
from reinforge.envs.harbor.task import HarborTask, find_tasks, load_task
from reinforge.envs.harbor.verify import (
    LOGS_DIR,
    LOGS_DISK_BYTES,
    TESTS_DIR,
    AgentFault,
    VerifierError,
    filter_workspace,
    quiesce_and_snapshot,
    run_verifier,
    verifier_env,
)
from reinforge.envs.rubric import Reward, Rubric
from reinforge.errors import UsageError
from reinforge.policy.client import ChatClient
from reinforge.sandbox.docker import DockerProvider
from reinforge.sandbox.docker_images import unreachable
from reinforge.sandbox.local import LocalProvider
from reinforge.sandbox.pool import PooledSandbox, SandboxPool
from reinforge.sandbox.protocol import (
    HostView,
    Image,
    SandboxError,
    SandboxProvider,
    SandboxSpec,
)
from reinforge.types import Section, Task

AgentName = Literal["model", "oracle", "nop"]
AGENTS: tuple[str, ...] = get_args(AgentName)
WORKSPACE = "harbor_workspace"
"""The key of the agent's workspace tar in `Episode.resources` (never serialised)."""
SYSTEM_PROMPT = (
    "You are an agent working in a Linux sandbox. Your working directory is {workdir}. "
    "Use the tools to inspect and change files and to run commands. When the task is "
    "done, answer with a short summary and no tool call."
)


class HarborEnvironment(Environment):
    """Harbor tasks in local sandboxes, graded out of the agent's reach."""

    def __init__(
        self,
        tasks: list[HarborTask],
        name: str,
        args: HarborArgs,
        agent: AgentName | ScriptAgent = "model",
        provider: SandboxProvider | None = None,
    ) -> None:
        self.args = args
        self.skipped = _build_images(tasks, args.docker)
        self.runnable = {t.name: t for t in tasks if t.name not in self.skipped}
        for task_name, reason in self.skipped.items():
            print(f"skipped Harbor task {task_name}: {reason}", file=sys.stderr)
        if not self.runnable:
            raise UsageError(f"{name}: no task can run here ({len(tasks)} skipped)")
        self.sandbox_tools = SandboxTools()
        # the harness's own limits; `env.max_turns` and `env.max_tokens_per_turn` change them
        harness = Harness(
            tools=self.sandbox_tools.tools(args.tools), max_turns=20, max_tokens_per_turn=512
        )
        rubric = Rubric(
            Reward(self.verifier_reward, name="reward"),
            Reward(tool_format, args.format_weight, name="tool_format"),
        )
        super().__init__(harness, rubric)
        self.name = name
        self.agent: AgentName | ScriptAgent = "model"
        self.use_agent(agent)
        self._provider = provider
        self._owned: LocalProvider | None = None
        self._docker_provider: DockerProvider | None = None
        self._pools: dict[str, SandboxPool] = {}
        self._pools_lock = asyncio.Lock()

    def use_agent(self, agent: str | ScriptAgent) -> None:
        if not isinstance(agent, ScriptAgent) and agent not in AGENTS:
            raise UsageError(f"unknown agent {agent!r}; one of {', '.join(AGENTS)}")
        self.agent = agent  # type: ignore[assignment]

    def with_agent(self, agent: AgentName | ScriptAgent) -> HarborEnvironment:
        """The same tasks and settings, played by `agent`, on this environment's sandbox
        provider (close the copy before this one, which closes a provider it owns)."""
        tasks = list(self.runnable.values())
        copy = HarborEnvironment(tasks, self.name, self.args, agent, self._the_provider())
        copy.harness = replace(
            copy.harness,
            max_turns=self.harness.max_turns,
            max_tokens_per_turn=self.harness.max_tokens_per_turn,
        )
        return copy

    @property
    def agent_name(self) -> str:
        return self.agent.name if isinstance(self.agent, ScriptAgent) else self.agent

    # ---------------------------------------------------------------- tasks

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        """Every runnable task when `n` covers them (cycling past that), else a seeded
        sample of `n`."""
        names = sorted(self.runnable)
        chosen = (
            random.Random(seed).sample(names, n)
            if n < len(names)
            else [names[i % len(names)] for i in range(n)]
        )
        return [self._task(name, i) for i, name in enumerate(chosen)]

    def _task(self, name: str, index: int) -> Task:
        task = self.runnable[name]
        return Task(
            id=name if index < len(self.runnable) else f"{name}#{index}",
            prompt=[{"role": "user", "content": task.instruction}],
            info={"harbor_task": name},
        )

    def harbor_task(self, task: Task) -> HarborTask:
        return self.runnable[task.info["harbor_task"]]

    def new_episode(self, task: Task) -> Episode:
        episode = super().new_episode(task)
        workdir = self.harbor_task(task).workdir
        if self.agent in ("model", "oracle"):  # the oracle's transcript is a model's
            system = {"role": "system", "content": SYSTEM_PROMPT.format(workdir=workdir)}
            episode.messages.insert(0, system)
        episode.state.update(harbor_task=task.info["harbor_task"], agent=self.agent_name)
        episode.extras[Grading] = Grading()
        return episode

    def spec(self, task: HarborTask, *, verifier: bool = False) -> SandboxSpec:
        """The sandbox the task asks for in task.toml and its Dockerfile."""
        resources = task.config.environment
        internet = self.args.allow_internet and task.config.agent_internet and not verifier
        writable: tuple[str, ...] = (TESTS_DIR,) if verifier else ()
        if not verifier and self.agent == "oracle":
            writable = (SOLUTION_DIR,)
        return SandboxSpec(
            base=Image(task.image.name) if task.image else HostView(),
            disk_bytes=resources.storage_mb << 20,
            memory_bytes=resources.memory_mb << 20,
            cpus=resources.cpus,
            network="on" if internet else "off",
            workdir=task.workdir,
            env={} if verifier else dict(task.env),
            writable_dirs=writable,
            own_disks={LOGS_DIR: LOGS_DISK_BYTES} if verifier else {},
        )

    # ---------------------------------------------------------------- episode

    async def start(self, episode: Episode) -> None:
        task = self.harbor_task(episode.task)
        pool = await self._pool(self.spec(task))
        sandbox = await pool.acquire()
        episode.resources[SANDBOX] = sandbox
        try:
            if task.image is None:  # an image holds its files already
                await sandbox.upload_tar(task.environment_tar(), "/")
        except BaseException:  # `rollout` calls `stop` only once `start` has returned
            episode.resources.pop(SANDBOX, None)
            await asyncio.shield(sandbox.close())
            raise

    async def _play(self, client: ChatClient, episode: Episode) -> None:
        """The agent phase, within `[agent] timeout_sec`; running out ends it (the episode
        is truncated) and grading goes on."""
        task = self.harbor_task(episode.task)
        grading: Grading = episode.extras[Grading]
        timeout = task.config.agent.timeout_sec
        try:
            async with asyncio.timeout(timeout):
                if self.agent == "model":
                    await super()._play(client, episode)
                elif self.agent == "oracle":
                    read_first = any(tool.name == "read_file" for tool in self.harness.tools)
                    await play_oracle(task, episode, self.sandbox_tools, read_first)
                elif isinstance(self.agent, ScriptAgent):
                    await play_script(self.agent, task, episode)
        except TimeoutError:
            episode.truncated = True
            grading.agent_timed_out = True
        grading.agent_done = True

    async def stop(self, episode: Episode) -> None:
        """Kill the agent's processes, copy its workspace out, destroy its sandbox, then
        grade the workspace in a fresh one (only when the agent phase completed). The
        grading joins the episode's state however far it got, a cancelled one too."""
        sandbox: PooledSandbox | None = episode.resources.pop(SANDBOX, None)
        if sandbox is None:
            return
        task = self.harbor_task(episode.task)
        grading: Grading = episode.extras[Grading]
        grading.hack_flags = hack_flags(episode.messages, task.workdir)
        try:
            await self._grade(task, episode, sandbox, grading)
        finally:
            episode.state.update(grading.info())

    async def _grade(
        self, task: HarborTask, episode: Episode, sandbox: PooledSandbox, grading: Grading
    ) -> None:
        try:
            if grading.agent_done:
                raw = await quiesce_and_snapshot(sandbox, task.workdir)
                episode.resources[WORKSPACE] = filter_workspace(raw, task.workdir)
        except AgentFault as fault:
            _fail(grading, fault)
        finally:
            await asyncio.shield(sandbox.close())
        if WORKSPACE in episode.resources:
            await self._verify(task, episode, grading)

    async def _verify(self, task: HarborTask, episode: Episode, grading: Grading) -> None:
        spec = self.spec(task, verifier=True)
        env = verifier_env(task.config.verifier.env, task.env, task.tests_dir, task.workdir)
        try:
            result = await run_verifier(
                self._the_provider(spec),
                spec,
                episode.resources[WORKSPACE],
                task.tests_dir,
                task.shipped_paths(),
                env,
                task.config.verifier.timeout_sec,
            )
        except AgentFault as fault:
            _fail(grading, fault)
            return
        except VerifierError as error:
            grading.verifier_error = str(error)
            return
        grading.reward = result.reward
        grading.verifier_rewards = result.rewards
        grading.verifier_exit_code = result.exit_code
        grading.verifier_output = result.output[-OUTPUT_CHARS:]

    def verifier_reward(self, episode: Episode) -> float:
        """The verifier's reward; a verifier that failed makes the rollout an error."""
        grading: Grading | None = episode.extras.get(Grading)
        if grading is not None and grading.verifier_error is not None:
            raise VerifierError(grading.verifier_error)
        if grading is None or grading.reward is None:
            raise VerifierError("the episode was not graded")
        return float(grading.reward)

    # ---------------------------------------------------------------- sandboxes

    def _the_provider(self, spec: SandboxSpec | None = None) -> SandboxProvider:
        """The local provider (or the one given), or Docker for a spec whose base is a
        task's image."""
        if spec is not None and isinstance(spec.base, Image):
            if self._docker_provider is None:
                self._docker_provider = DockerProvider(docker=self.args.docker)
            return self._docker_provider
        if self._provider is None:
            if self._owned is None:
                self._owned = LocalProvider()
            return self._owned
        return self._provider

    async def _pool(self, spec: SandboxSpec) -> SandboxPool:
        """One pool per distinct sandbox spec (tasks may ask for different resources)."""
        key = repr(spec)
        async with self._pools_lock:
            if key not in self._pools:
                provider = self._the_provider(spec)
                pool = SandboxPool(provider, spec, max_concurrency=self.args.max_sandboxes, warm=0)
                self._pools[key] = await pool.start()
            return self._pools[key]

    async def aclose(self) -> None:
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            await pool.aclose()
        if self._owned is not None:
            await self._owned.aclose()
            self._owned = None
        if self._docker_provider is not None:
            await self._docker_provider.aclose()
            self._docker_provider = None


def _build_images(tasks: list[HarborTask], docker: str) -> dict[str, str]:
    """Build the image of each task that needs Docker with the `docker` CLI ('' for none);
    why each that cannot run does not."""
    needing = [t for t in tasks if t.plan.needs_docker and t.image is None]
    if not needing:
        return {}
    engine = unreachable(docker) if docker else 'Docker is off (docker = "")'
    skipped: dict[str, str] = {}
    for task in needing:
        if engine is not None:
            skipped[task.name] = f"{task.plan.needs_docker}, and no Docker engine: {engine}"
            continue
        print(f"building the image of Harbor task {task.name}", file=sys.stderr)
        try:
            task.build(docker)
        except SandboxError as error:
            skipped[task.name] = str(error)
    return skipped


def tool_format(episode: Episode) -> float:
    """1 when the agent called a tool and every call it wrote parsed and named a tool, else
    0. A small weight gives a signal before any rollout passes (a model that has just
    learned the format still writes malformed JSON half the time); it can be had with any
    well-formed call, so it must stay well below the verifier's 1."""
    return float(episode.tool_calls > 0 and episode.tool_errors == 0)


Split = Literal["all", "train", "test"]


class HarborArgs(Section):
    """The arguments of a Harbor task set: a task directory, a folder of them, or
    `coding`. Its turn and token limits are `env.max_turns` and `env.max_tokens_per_turn`,
    like every environment's."""

    tiers: list[str] | None = None
    """Keep the tasks whose `[metadata] difficulty` is one of these; None keeps all."""
    split: Split = "all"
    """Keep the train or the test part of a fixed split, or every task. A task is in test
    when a hash of its name falls in the lowest `test_fraction` of the range, so the side
    of a task never changes when tasks are added, and a run trained on `train` is
    evaluated on tasks it never saw."""
    test_fraction: float = Field(0.25, gt=0.0, lt=1.0)
    """The share of the hash range that is the test split."""
    tools: tuple[ToolName, ...] = Field(TOOL_NAMES, min_length=1)
    """The sandbox tools the model is offered: each one's schema is in every prompt, so
    fewer make every prompt shorter."""
    format_weight: float = 0.0
    """Weight of the `tool_format` term (1 when the agent called a tool and every call it
    wrote parsed and named a tool): easy to earn, so keep it well below the verifier's 1."""
    allow_internet: bool = False
    """Let an agent's sandbox reach the network where its task.toml allows it too; the
    verifier's never does."""
    max_sandboxes: int = Field(32, ge=1)
    """Agent sandboxes alive at once, per distinct sandbox spec."""
    docker: str = "docker"
    """The Docker CLI for the tasks that need an image build; "" for none, and such tasks
    are skipped."""


def load_environment(
    path: str | Path,
    args: HarborArgs,
    name: str | None = None,
    train_only: Sequence[Path] = (),
) -> Environment:
    """A task dir or a folder of them as an environment (named after the directory).
    `train_only` are task dirs that join the train split whatever their names (generated
    variants of the tasks, which must never be held out)."""
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"{path}: not a directory")
    tasks = find_tasks(path)
    if args.split != "all":
        in_test = args.split == "test"
        tasks = [t for t in tasks if in_test_split(t.name, args.test_fraction) == in_test]
    if args.split != "test":
        tasks += [load_task(p) for p in train_only]
    if args.tiers is not None:
        tasks = [t for t in tasks if t.config.metadata.get("difficulty") in args.tiers]
    if not tasks:
        raise UsageError(f"{path}: no task of tiers {args.tiers} in split {args.split!r}")
    return HarborEnvironment(tasks, name or path.resolve().name, args)


def _fail(grading: Grading, fault: AgentFault) -> None:
    """The agent's own doing stopped its grading: a 0, with the reason in its info."""
    grading.reward, grading.verifier_fault = 0.0, str(fault)


def in_test_split(task_name: str, test_fraction: float) -> bool:
    return zlib.crc32(task_name.encode()) / 2**32 < test_fraction


def use_agent(env: Environment, agent: str) -> None:
    """Select a scripted agent (`oracle`, `nop`) where the environment has them."""
    if agent == "model":
        if isinstance(env, HarborEnvironment):
            env.use_agent(agent)
        return
    if not isinstance(env, HarborEnvironment):
        raise UsageError(
            f"environment {env.name!r} has no {agent!r} agent: scripted agents run Harbor "
            "tasks (a task directory, a folder of them, or `coding`)"
        )
    env.use_agent(agent)
