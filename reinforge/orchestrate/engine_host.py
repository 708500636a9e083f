"""What runs beside one engine process on its node: `reinforge serve` started there, its
URL, and the control posts it takes from the node's loopback alone. It imports no model
stack (no transformers, no trainer), so a Ray actor that hosts an engine on any node
starts at the cost of torch and Ray alone, not of everything a run imports."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from reinforge.errors import UsageError

START_S = 600.0
"""The longest an engine may take to answer once started (vLLM compiles for minutes)."""
STOP_S = 30.0
"""The longest an engine may take to exit after SIGTERM before it is killed."""
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1


def exited_early(index: int, code: int | None, log: Path, copy: Path | None = None) -> str:
    """Names `copy`, the log's copy on the run's node, for an engine that logs elsewhere."""
    return (
        f"engine {index} (reinforge serve) exited with code {code} before it answered: "
        f"{_last_line(log)} (log: {copy or log})"
    )


def silent(index: int, log: Path) -> str:
    return f"engine {index} (reinforge serve) did not answer within {START_S:.0f} s (log: {log})"


def spawn(settings: Path, port: int, log: Path, host: str | None = None) -> subprocess.Popen[bytes]:
    """`reinforge serve --config settings` on `host` (`server.host` by default: 127.0.0.1)
    at `port`, logging to `log`, dying with this process. In a process group of its own,
    so that Ctrl-C in the terminal stops the run, which stops its engines once it has saved
    what it can, rather than the engines while a step still syncs weights to them."""
    argv = [sys.executable, "-m", "reinforge", "serve", "--config", str(settings),
            "--port", str(port), *(["--host", host] if host else [])]  # fmt: skip
    with log.open("ab") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,
            preexec_fn=None if _LIBC is None else partial(_die_with_parent, os.getpid()),
        )


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports of `host` free now, all different (held together until each is known)."""
    probes = [socket.socket(_family(host)) for _ in range(count)]
    try:
        for probe in probes:
            probe.bind((host, 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def base_url(host: str, port: int) -> str:
    """The /v1 URL of an engine listening on `host` (an IPv6 address in brackets)."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"


def health_url(url: str) -> str:
    """The `/health` route of the engine at /v1 URL `url`."""
    return f"{url.removesuffix('/v1')}/health"


async def answers(http: httpx.AsyncClient, url: str) -> bool:
    """Whether the engine at /v1 URL `url` answers `/health`."""
    try:
        return (await http.get(health_url(url))).status_code == 200
    except httpx.HTTPError:
        return False


def answers_now(url: str) -> bool:
    """`answers`, from code that waits in its own thread (an engine's actor)."""
    try:
        return httpx.get(health_url(url), timeout=5.0).status_code == 200
    except httpx.HTTPError:
        return False


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _die_with_parent(parent: int) -> None:
    """In the child, before it runs `reinforge serve`: SIGTERM when the parent dies, even
    by SIGKILL, so that a killed run leaves no engine behind."""
    assert _LIBC is not None
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the signal was set
        os._exit(1)


def loopback(url: str) -> httpx.HTTPTransport:
    """Connections to the engine at `url` from this machine's loopback address: the only
    source its weights, pause and resume routes take, and one that reaches every address of
    this machine, an engine listening on its node's address included."""
    return httpx.HTTPTransport(local_address="::1" if ":" in httpx.URL(url).host else "127.0.0.1")


class EngineGone(UsageError):
    """An engine that could not be reached: it died, or stopped answering."""


def post_to_engine(
    http: httpx.Client, route: str, body: dict[str, Any], what: str
) -> dict[str, Any]:
    url = str(http.base_url).rstrip("/")
    try:
        response = http.post(route, json=body)
    except httpx.HTTPError as error:
        raise EngineGone(f"the engine at {url} did not {what}: {error}") from error
    if response.status_code != 200:
        message = response.json().get("error", {}).get("message", response.text)
        raise UsageError(f"the engine at {url} refused to {what}: {message}")
    return response.json()


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(nothing in its log)"
