"""The run's own engine processes (`rollout.engines` > 1): `reinforge serve` of the run's
model and engine settings, each on a free port of 127.0.0.1, taking weights with a token
made for the run. Each writes its log to `<run dir>/engines/engine-<i>.log`.

They die with the run: `stop` ends them when the run ends, and should the run's process
be killed before it can, Linux sends each a SIGTERM (the parent-death signal). The loop
sees only their URLs and token (`RemoteEngine`), so a launcher that places the same
command elsewhere (Ray actors on other machines) can stand in for this one.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from reinforge.config import Config, ServeConfig
from reinforge.errors import UsageError
from reinforge.policy.config import ServerConfig

START_S = 600.0
"""The longest an engine may take to answer once started (vLLM compiles for minutes)."""
STOP_S = 30.0
"""The longest an engine may take to exit after SIGTERM before it is killed."""
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1


class EngineProcesses:
    def __init__(self, ports: list[int], logs: Path) -> None:
        self.ports = ports
        self.urls = [f"http://127.0.0.1:{port}/v1" for port in ports]
        self.logs = logs
        self.token = secrets.token_urlsafe(32)
        self.processes: list[subprocess.Popen[bytes]] = []

    @classmethod
    async def start(cls, config: Config) -> EngineProcesses:
        """Start `config.rollout.engines` engines and wait until each answers. Call it on
        a thread that lives as long as the run (the event loop's): the parent-death
        signal comes when the starting thread ends."""
        logs = config.run_dir / "engines"
        logs.mkdir(parents=True, exist_ok=True)
        engines = cls(_free_ports(config.rollout.engines), logs)
        settings = Path(tempfile.mkdtemp(prefix="reinforge-engines-")) / "serve.toml"
        try:  # the settings hold the token: private, and gone once the engines have read them
            settings.write_text(settings_toml(engines.serve_config(config)))
            for index, port in enumerate(engines.ports):
                engines.processes.append(_spawn(settings, port, engines.log(index)))
            await engines._answering()
        except BaseException:
            engines.stop()
            raise
        finally:
            shutil.rmtree(settings.parent, ignore_errors=True)
        return engines

    def serve_config(self, config: Config) -> ServeConfig:
        """What each engine serves: the run's model, engine and sampling settings."""
        server = ServerConfig(weights_token=self.token, sampling=config.rollout.sampling)
        return ServeConfig(model=config.model, engine=config.engine, server=server)

    def log(self, index: int) -> Path:
        return self.logs / f"engine-{index}.log"

    def stop(self) -> None:
        """SIGTERM to every engine, then SIGKILL to any still running after `STOP_S`."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    async def _answering(self) -> None:
        """Until every engine answers `/health`; one that exits first, or stays silent
        past `START_S`, is one line naming its log."""
        deadline = time.monotonic() + START_S
        async with httpx.AsyncClient(timeout=5.0) as http:
            for index, process in enumerate(self.processes):
                while not await _answers(http, self.ports[index]):
                    log = self.log(index)
                    if process.poll() is not None:
                        raise UsageError(
                            f"engine {index} (reinforge serve) exited with code "
                            f"{process.returncode} before it answered: {_last_line(log)} "
                            f"(log: {log})"
                        )
                    if time.monotonic() > deadline:
                        raise UsageError(
                            f"engine {index} (reinforge serve) did not answer within "
                            f"{START_S:.0f} s (log: {log})"
                        )
                    await asyncio.sleep(0.25)


def _spawn(settings: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "reinforge", "serve", "--config", str(settings),
            "--port", str(port)]  # fmt: skip
    with log.open("ab") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=None if _LIBC is None else partial(_die_with_parent, os.getpid()),
        )


async def _answers(http: httpx.AsyncClient, port: int) -> bool:
    try:
        return (await http.get(f"http://127.0.0.1:{port}/health")).status_code == 200
    except httpx.HTTPError:
        return False


def _free_ports(count: int) -> list[int]:
    """Ports free now, all different (held together until each is known)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _die_with_parent(parent: int) -> None:
    """In the child, before it runs `reinforge serve`: SIGTERM when the parent dies, even
    by SIGKILL, so that a killed run leaves no engine behind."""
    assert _LIBC is not None
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the signal was set
        os._exit(1)


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


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(nothing in its log)"
