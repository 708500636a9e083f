"""Agent tools that act in the episode's own sandbox, and the environment that provides it.

`SandboxEnvironment` lends each episode a sandbox from a shared pool (paused while the
model thinks, resumed at each tool call) and returns it when the episode ends, however it
ends. `SandboxTools` gives the model `bash`, `read_file`, `write_file` and `edit` on that
sandbox, with output truncation and per-call timeouts (the file tools' too: a FIFO or a
device blocks a read or a write for as long as nothing is at its other end). Graders never
run in the sandbox: `collect` copies out what they need before it is released.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Literal, TypeVar, get_args

from reinforge.envs.environment import Environment, Harness
from reinforge.envs.episode import Episode
from reinforge.envs.rubric import Rubric
from reinforge.envs.tools import Tool
from reinforge.errors import UsageError
from reinforge.sandbox.local import LocalProvider
from reinforge.sandbox.pool import PooledSandbox, SandboxPool
from reinforge.sandbox.protocol import ExecResult, SandboxProvider, SandboxSpec

ToolName = Literal["bash", "read_file", "write_file", "edit"]
TOOL_NAMES: tuple[ToolName, ...] = get_args(ToolName)
SANDBOX = "sandbox"
"""The key of the episode's sandbox in `Episode.resources`."""

T = TypeVar("T")


def sandbox_of(episode: Episode) -> PooledSandbox:
    sandbox = episode.resources.get(SANDBOX)
    if sandbox is None:
        raise RuntimeError("this episode has no sandbox (use a SandboxEnvironment)")
    return sandbox


class SandboxTools:
    """The tool set; each call is bounded in time and in how much text it returns."""

    def __init__(self, timeout_s: float = 30.0, max_output_chars: int = 4000) -> None:
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars

    def tools(self, names: Sequence[str] = TOOL_NAMES) -> list[Tool]:
        """The tools called `names`: every one the model is told of costs prompt tokens in
        each rollout, so an environment may offer fewer."""
        unknown = [name for name in names if name not in TOOL_NAMES]
        if unknown or not names:
            raise UsageError(f"tools {list(names)}: name one or more of {', '.join(TOOL_NAMES)}")
        return [Tool(getattr(self, name)) for name in names]

    async def bash(self, command: str, episode: Episode) -> str:
        """Run a shell command in your sandbox; returns its exit code and output.

        Args:
            command: The command line, run by /bin/sh in the working directory.
        """
        result = await sandbox_of(episode).exec(
            ["/bin/sh", "-c", command],
            timeout=self.timeout_s,
            max_output_bytes=4 * self.max_output_chars,
        )
        return self.report(result)

    async def read_file(self, path: str, episode: Episode) -> str:
        """Read a text file from your sandbox.

        Args:
            path: Absolute, or relative to the working directory.
        """
        read = sandbox_of(episode).read_files([path])
        content = (await self._in_time(read, f"reading {path}"))[path]
        if content is None:  # missing, or a FIFO or device, which the sandbox will not open
            raise FileNotFoundError(f"{path} (no such regular file)")
        return self._truncate(content.decode(errors="replace"))

    async def write_file(self, path: str, content: str, episode: Episode) -> str:
        """Create or overwrite a text file in your sandbox.

        Args:
            path: Absolute, or relative to the working directory.
            content: The whole new content of the file.
        """
        data = content.encode()
        await self._in_time(sandbox_of(episode).write_files({path: data}), f"writing {path}")
        return f"wrote {len(data)} bytes to {path}"

    async def edit(self, path: str, old: str, new: str, episode: Episode) -> str:
        """Replace one exact occurrence of a piece of text in a file.

        Args:
            path: Absolute, or relative to the working directory.
            old: The text to replace; it must occur exactly once.
            new: The replacement.
        """
        sandbox = sandbox_of(episode)
        content = (await self._in_time(sandbox.read_files([path]), f"reading {path}"))[path]
        if content is None:  # missing, or a FIFO or device, which the sandbox will not open
            raise FileNotFoundError(f"{path} (no such regular file)")
        text = content.decode(errors="replace")
        count = text.count(old) if old else 0
        if count != 1:
            raise ValueError(f"the text to replace occurs {count} times in {path}; need once")
        edited = {path: text.replace(old, new).encode()}
        await self._in_time(sandbox.write_files(edited), f"writing {path}")
        return f"edited {path}"

    async def _in_time(self, call: Awaitable[T], doing: str) -> T:
        """A file call within the per-call timeout, as `bash` is: the sandbox's own
        `read_files` and `write_files` have none, and opening a FIFO waits until something
        opens its other end. On time out the call's process in the sandbox is killed."""
        try:
            return await asyncio.wait_for(call, self.timeout_s)
        except TimeoutError:
            raise TimeoutError(
                f"{doing} did not finish within {self.timeout_s} s: is it a FIFO or a device "
                "rather than a regular file?"
            ) from None

    def report(self, result: ExecResult) -> str:
        """A command's result as the `bash` tool returns it to the model."""
        status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
        output = (result.stdout + result.stderr).decode(errors="replace")
        return f"[{status}]\n{self._truncate(output)}"

    def _truncate(self, text: str) -> str:
        if len(text) <= self.max_output_chars:
            return text
        return (
            text[: self.max_output_chars]
            + f"\n[... {len(text) - self.max_output_chars} more characters]"
        )


class SandboxEnvironment(Environment):
    """An environment whose episodes each get their own sandbox.

    Override `prepare` to put the task's files in place and `collect` to copy out what the
    graders need (into `episode.state`); the sandbox is gone by the time they run.
    """

    def __init__(
        self,
        harness: Harness | None = None,
        rubric: Rubric | None = None,
        spec: SandboxSpec | None = None,
        provider: SandboxProvider | None = None,
        max_sandboxes: int = 32,
    ) -> None:
        super().__init__(harness, rubric)
        self.spec = spec or SandboxSpec()
        self._provider = provider
        self._max_sandboxes = max_sandboxes
        self._owned: LocalProvider | None = None
        self._pool: SandboxPool | None = None
        self._pool_lock = asyncio.Lock()

    async def prepare(self, episode: Episode, sandbox: PooledSandbox) -> None:
        """Put the task's files into the fresh sandbox."""

    async def collect(self, episode: Episode, sandbox: PooledSandbox) -> None:
        """Copy what the graders need out of the sandbox, into `episode.state`."""

    async def start(self, episode: Episode) -> None:
        pool = await self._the_pool()
        sandbox = await pool.acquire()
        episode.resources[SANDBOX] = sandbox
        await self.prepare(episode, sandbox)

    async def stop(self, episode: Episode) -> None:
        sandbox = episode.resources.pop(SANDBOX, None)
        if sandbox is None:
            return
        try:
            await self.collect(episode, sandbox)
        finally:
            await asyncio.shield(sandbox.close())  # even when the rollout is cancelled

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
            self._pool = None
        if self._owned is not None:  # the provider is ours: its helper process goes too
            await self._owned.aclose()
            self._owned = None

    async def _the_pool(self) -> SandboxPool:
        async with self._pool_lock:
            if self._pool is None:
                provider = self._provider
                if provider is None:
                    provider = self._owned = LocalProvider()
                pool = SandboxPool(provider, self.spec, max_concurrency=self._max_sandboxes, warm=0)
                self._pool = await pool.start()
            return self._pool
