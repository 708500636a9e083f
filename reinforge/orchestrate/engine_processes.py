"""The run's own engine processes (`engines.kind = "spawned"`): `reinforge serve` of the run's
model and engine settings, each on a free port of 127.0.0.1, taking weights with a token
made for the run. Each writes its log to `<run dir>/engines/engine-<i>.log`.

They die with the run: `stop` ends them when the run ends, and should the run's process
be killed before it can, Linux sends each a SIGTERM (the parent-death signal). The loop
sees only their URLs and token (`RemoteEngine`), so a launcher that places the same
command elsewhere (Ray actors on other machines) can stand in for this one. `restart`
brings one back on its port, for the run's `Supervisor`.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

import httpx
import torch

from reinforge.config import Config, ServeConfig
from reinforge.errors import UsageError
from reinforge.orchestrate.broadcast_weights import BroadcastPush
from reinforge.orchestrate.config import BroadcastSync, SpawnedEngines
from reinforge.orchestrate.engine_host import (
    START_S,
    STOP_S,
    answers,
    base_url,
    exited_early,
    free_ports,
    silent,
    spawn,
)
from reinforge.orchestrate.weight_sync import EngineLinks, FilePush
from reinforge.policy.backends import samples_on_gpu
from reinforge.policy.config import ServerConfig


class EngineLauncher(Protocol):
    """The run's own engines as the loop and their supervisor see them, wherever they run:
    processes of this machine (`EngineProcesses`) or Ray actors (`orchestrate/ray_engines`)."""

    urls: list[str]
    """Each engine's /v1 URL; an engine keeps its URL across restarts."""
    token: str
    """The weights token every engine was started with."""

    async def ended(self, index: int) -> str | None:
        """How engine `index` ended, in words that follow "engine <index>" in the run's
        lines ("exited with code -9"); None while it runs."""
        ...

    def weight_sync(self) -> EngineLinks:
        """The transport that takes the trainer's weights to these engines."""
        ...

    async def restart(self, index: int) -> None:
        """Engine `index` again, at its URL, once it answers."""
        ...

    def log(self, index: int) -> Path: ...

    def stop(self) -> None: ...


class EngineProcesses:
    def __init__(
        self, ports: list[int], logs: Path, config: Config, spawned: SpawnedEngines
    ) -> None:
        self.ports = ports
        self.spawned = spawned
        self.urls = [base_url("127.0.0.1", port) for port in ports]
        self.logs = logs
        self.token = secrets.token_urlsafe(32)
        self.serve = engine_settings(config, self.token, samples_on_gpu(config.model))
        self.dtype = getattr(torch, self.serve.engine.dtype)
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @classmethod
    async def start(cls, config: Config, spawned: SpawnedEngines) -> EngineProcesses:
        """Start `spawned.count` engines of `config`'s settings and wait until each answers.
        Call it on a thread that lives as long as the run (the event loop's): the
        parent-death signal comes when the starting thread ends."""
        logs = config.run_dir / "engines"
        logs.mkdir(parents=True, exist_ok=True)
        engines = cls(free_ports(spawned.count), logs, config, spawned)
        try:
            await engines._launch(list(range(spawned.count)))
        except BaseException:
            engines.stop()
            raise
        return engines

    async def restart(self, index: int) -> None:
        """Engine `index` again, on its port, once it answers (killed first should it
        still run). On the event loop's thread, as `start`."""
        self._kill(self.processes[index])
        await self._launch([index])

    async def ended(self, index: int) -> str | None:
        code = self.processes[index].poll()
        return None if code is None else f"exited with code {code}"

    def weight_sync(self) -> EngineLinks:
        """Processes of this machine load a file of it, or take a broadcast."""
        sync = self.spawned.weight_sync
        if isinstance(sync, BroadcastSync):
            return BroadcastPush(self.urls, self.token, self.dtype, sync.timeout_s)
        return FilePush(self.urls, self.token, supervised=True)

    def log(self, index: int) -> Path:
        return self.logs / f"engine-{index}.log"

    def stop(self) -> None:
        """SIGTERM to every engine, then SIGKILL to any still running after `STOP_S`."""
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            self._kill(process, after_s=STOP_S)

    async def _launch(self, indices: list[int]) -> None:
        settings = Path(tempfile.mkdtemp(prefix="reinforge-engines-")) / "serve.toml"
        try:  # the settings hold the token: private, and gone once the engines have read them
            settings.write_text(settings_toml(self.serve))
            for index in indices:
                self.processes[index] = spawn(settings, self.ports[index], self.log(index))
            await self._answering(indices)
        finally:
            shutil.rmtree(settings.parent, ignore_errors=True)

    @staticmethod
    def _kill(process: subprocess.Popen[bytes], after_s: float = 0.0) -> None:
        """SIGKILL to `process` unless it exits within `after_s`."""
        try:
            process.wait(timeout=after_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    async def _answering(self, indices: list[int]) -> None:
        """Until engines `indices` answer `/health`; one that exits first, or stays silent
        past `START_S`, is one line naming its log."""
        deadline = time.monotonic() + START_S
        async with httpx.AsyncClient(timeout=5.0) as http:
            for index in indices:
                process = self.processes[index]
                while not await answers(http, self.urls[index]):
                    log = self.log(index)
                    if process.poll() is not None:
                        raise UsageError(exited_early(index, process.returncode, log))
                    if time.monotonic() > deadline:
                        raise UsageError(silent(index, log))
                    await asyncio.sleep(0.25)


def engine_settings(config: Config, token: str, gpu: bool) -> ServeConfig:
    """What each of a run's engines serves: the run's model, engine and sampling settings,
    taking weights with `token`. Its dtype is settled here, by whether the engines compute
    on a GPU, so that the weights pushed to them are cast to what they sample in."""
    server = ServerConfig(weights_token=token, sampling=config.rollout.sampling)
    engine = config.engine.model_copy(update={"dtype": config.engine.dtype_on(gpu)})
    return ServeConfig(model=config.model, engine=engine, server=server)


def settings_toml(serve: ServeConfig) -> str:
    """The file that `reinforge serve --config` reads back as `serve`: only what differs
    from the defaults, which the engine process reads from the same classes."""
    return _toml(serve.model_dump(mode="json", exclude_defaults=True))


def _toml(table: dict[str, Any], name: str = "") -> str:
    """A config dump as TOML: tables of scalars and arrays, all that a `ServeConfig` holds."""
    values = [f"{key} = {json.dumps(v)}\n" for key, v in table.items() if not isinstance(v, dict)]
    text = (f"[{name}]\n" if name and values else "") + "".join(values)
    for key, inner in table.items():
        if isinstance(inner, dict):
            text += _toml(inner, f"{name}.{key}" if name else key)
    return text
