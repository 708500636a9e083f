"""Two Ray nodes on this machine that stand in for two hosts, so that a test can place a
run's processes on a host that is not the driver's and see what crosses between them.

Host A is the head node, started at 127.0.0.1 (which Ray replaces by this machine's own
address) and offering the custom resource `host_a`; host B joins it at 127.0.0.2 offering
`host_b`. Each also offers one `rank_slot`, so that processes asking for one each (trainer
ranks) go one to a host. Each node has its own Ray temp dir, ports and temp folder
(`TMPDIR` of every process it starts). Where the
machine allows it (root, and `unshare -m` works), each node also runs in a mount namespace
of its own with a fresh tmpfs on /dev/shm: a file one host writes in its /dev/shm is not
there for the other, as on two machines, and a weight file handed over by its path
instead of its bytes would not be found. The driver (`TwoHosts.on_a`) then runs in host
A's namespace. Where it does not, the nodes share this machine's /dev/shm
(`TwoHosts.isolated` is False) and still have their own addresses and directories.

The network is shared: 127.0.0.2 is reachable from host A, which is what lets a test
check that engines are reached at their node's address.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from reinforge.orchestrate.engine_host import free_ports

_IN_CREATE = 0x100
START_S = 300.0
"""How long a node may take to join (Ray starts slowly on a loaded machine)."""
RAY = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
HEALTH_CHECKS = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "3000",
    "RAY_health_check_failure_threshold": "5",
}
"""Ray's checks of its nodes, a lost host found in ~20 s rather than Ray's own minute or
so: the fault tests wait for it. Five missed checks in a row, so a node merely slowed by
a loaded machine is not taken for lost."""
STOP_S = 5.0
"""How long a node's processes have to stop on SIGTERM before SIGKILL: a test's cluster
keeps nothing worth a longer wait."""


@dataclass
class Host:
    ip: str
    process: subprocess.Popen[bytes]
    """`ray start --block` of the node, leader of a session holding every process of it."""
    temp: Path
    log: Path

    @property
    def shm(self) -> Path:
        """The host's /dev/shm, as its own processes see it."""
        return Path(f"/proc/{self.process.pid}/root/dev/shm")

    @property
    def tmp(self) -> Path:
        """The host's temp folder (`TMPDIR` of its processes): what a process writes there
        stays on the host."""
        return self.temp / "tmp"

    def processes(self, title: str = "") -> set[int]:
        """The host's live processes (its Ray node's, and what they started) whose command
        line holds `title` (a Ray worker's holds its actor's class: `ray::RankActor`)."""
        found = set()
        for pid in session(self.process.pid):
            try:
                if title.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.add(pid)
            except OSError:
                continue  # it exited meanwhile
        return found

    def kill(self) -> None:
        """SIGKILL to every process of the host, at once: the machine lost, as by a power
        cut. Nothing of it says goodbye to the cluster."""
        _send(self.processes(), signal.SIGKILL)

    def freeze(self) -> None:
        """SIGSTOP to every process of the host, until none runs: the machine hangs rather
        than dies. Its sockets stay open, so connections are taken and never answered,
        where a dead host's are refused at once. `thaw` lets it go on."""
        while running := {pid for pid in self.processes() if _state(pid) not in "Tt"}:
            _send(running, signal.SIGSTOP)  # again for any a running one started meanwhile
            time.sleep(0.1)

    def thaw(self) -> None:
        """SIGCONT to every process of the host."""
        _send(self.processes(), signal.SIGCONT)


def _send(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _state(pid: int) -> str:
    """The state letter of process `pid` ("T": stopped; "X": dead, as once it has exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


@dataclass
class TwoHosts:
    address: str
    """The head's GCS address, for `ray.init(address=...)` or `cluster.address`."""
    a: Host
    b: Host
    isolated: bool
    """Whether each host has a /dev/shm of its own."""

    def on_a(self, argv: list[str]) -> list[str]:
        """`argv` run as a process of host A (in its mount namespace where isolated), in
        the working directory it is started in (entering a namespace moves to its root),
        with the nodes' authentication mode: a Ray started earlier in the test process
        leaves `RAY_AUTH_MODE=token` in its environment, and a driver with it is refused
        by nodes without."""
        argv = ["env", "RAY_AUTH_MODE=disabled", *argv]
        if not self.isolated:
            return argv
        return ["nsenter", f"--target={self.a.process.pid}", "--mount", "--wd=.", "--", *argv]


def can_isolate() -> bool:
    """Whether nodes may have mount namespaces of their own: root, and `unshare` allowed."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = ["unshare", "-m", "--propagation", "private", "true"]
    return subprocess.run(probe, capture_output=True).returncode == 0


@contextmanager
def two_hosts(memory_mib: int = 512) -> Iterator[TwoHosts]:
    """Hosts A and B, joined and ready; both stopped after, every process of each. Each
    host's /dev/shm (where isolated) holds `memory_mib`, its object store ~40% of it: room
    for the tiny model's weights, more for a real model's (`benchmarks/weight_sync.py`)."""
    isolated = can_isolate()
    root = Path(tempfile.mkdtemp(prefix="rf-2h-"))  # short: Ray's sockets live under it
    port, client_port = free_ports(2)
    hosts: list[Host] = []
    try:
        head = ["--head", f"--port={port}", f"--ray-client-server-port={client_port}",
                "--include-dashboard=false"]  # fmt: skip
        hosts.append(_start("127.0.0.1", "host_a", head, root / "a", isolated, memory_mib))
        address = _head_address(hosts[0])
        _wait_for_nodes(address, 1, hosts)
        joining = [f"--address={address}"]
        hosts.append(_start("127.0.0.2", "host_b", joining, root / "b", isolated, memory_mib))
        _wait_for_nodes(address, 2, hosts)
        yield TwoHosts(address, hosts[0], hosts[1], isolated)
    finally:
        for host in reversed(hosts):
            _stop(host.process)
        shutil.rmtree(root, ignore_errors=True)


def _start(
    ip: str, resource: str, role: list[str], temp: Path, isolated: bool, memory_mib: int
) -> Host:
    (temp / "tmp").mkdir(parents=True)
    (agent_port,) = free_ports(1)
    argv = [*RAY, "start", "--block", *role, f"--node-ip-address={ip}",
            f"--resources={{\"{resource}\": 100, \"rank_slot\": 1}}", "--num-cpus=4",
            f"--object-store-memory={memory_mib * 400_000}", f"--temp-dir={temp}",
            f"--dashboard-agent-listen-port={agent_port}", "--disable-usage-stats"]  # fmt: skip
    if isolated:  # its own /dev/shm: a fresh tmpfs in a mount namespace of its own
        mount = f'mount -t tmpfs -o size={memory_mib}m,mode=1777 tmpfs /dev/shm && exec "$@"'
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", mount, "sh", *argv]
    log = temp / "node.log"
    # a cluster of tests: Ray would otherwise ask for the token of ~/.ray where one exists
    env = {**os.environ, **HEALTH_CHECKS, "RAY_AUTH_MODE": "disabled", "TMPDIR": str(temp / "tmp")}
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
    return Host(ip, process, temp, log)


def _head_address(head: Host) -> str:
    """The GCS address the head wrote once started: Ray puts this machine's address in
    place of 127.0.0.1, which it takes for unreachable from other hosts."""
    written = head.temp / "ray_current_cluster"
    deadline = time.monotonic() + START_S
    while not written.exists() or not written.read_text().strip():
        if head.process.poll() is not None:
            raise RuntimeError(f"ray head exited: {head.log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"ray head did not start in {START_S} s")
        time.sleep(0.5)
    address = written.read_text().strip()
    head.ip = address.rsplit(":", 1)[0]
    return address


def _wait_for_nodes(address: str, count: int, hosts: list[Host]) -> None:
    """Until the cluster at `address` has `count` live nodes; a node that exits first fails
    with its log."""
    probe = (
        "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
        "print(sum(n['Alive'] for n in ray.nodes()))"
    )
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        for host in hosts:
            if host.process.poll() is not None:
                raise RuntimeError(f"ray node {host.ip} exited: {host.log.read_text()[-3000:]}")
        asked = subprocess.run(
            [sys.executable, "-c", probe, address], capture_output=True, text=True, timeout=120
        )
        if asked.returncode == 0 and int(asked.stdout.split()[-1]) >= count:
            return
        time.sleep(1.0)
    raise RuntimeError(f"the cluster at {address} did not have {count} nodes in {START_S} s")


def _stop(leader: subprocess.Popen[bytes]) -> None:
    """Every process of the node's session: SIGTERM, then SIGKILL to any left after
    `STOP_S`. By the session the fixture made, never by name (other Ray clusters may run
    here)."""
    for sig, wait_s in ((signal.SIGTERM, STOP_S), (signal.SIGKILL, 10.0)):
        for pid in session(leader.pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while session(leader.pid) and time.monotonic() < deadline:
            leader.poll()  # reaps the leader, which is this process's child
            time.sleep(0.2)
    leader.poll()


def session(sid: int) -> list[int]:
    """The live processes of session `sid`."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # fields: state, ppid, pgrp, session
            pids.append(int(stat.parts[2]))
    return pids


@contextmanager
def created(folder: Path) -> Iterator[list[str]]:
    """The names created in `folder` while the block runs (inotify: however briefly they
    lived), in the list yielded, filled once the block ends. `folder` may be another mount
    namespace's, through /proc/PID/root."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    if fd < 0 or libc.inotify_add_watch(fd, str(folder).encode(), _IN_CREATE) < 0:
        raise OSError(ctypes.get_errno(), f"cannot watch {folder}")
    names: list[str] = []
    try:
        yield names
    finally:
        try:
            while True:
                events = os.read(fd, 1 << 20)
                while events:
                    _, _, _, size = struct.unpack_from("iIII", events)
                    names.append(events[16 : 16 + size].rstrip(b"\0").decode())
                    events = events[16 + size :]
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
