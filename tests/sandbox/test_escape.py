"""Escape and fault suite: each attack fails with a clear status and the host is unaffected.

Network rule of this suite: traffic goes only to loopback or into the sandbox's own
network namespace. "Public egress fails" is shown with a documentation address
(192.0.2.1, TEST-NET-1): the sandbox's namespace has no route, so connect() fails at once
with ENETUNREACH and no packet ever leaves the machine.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import reinforge
from reinforge.sandbox import LocalProvider, LocalSandbox, SandboxSpec
from reinforge.sandbox.reaper import pid_namespace_members

from .helpers import FILL_PIDS, host_pid_alive, namespace_cpu_ticks, needs_python3

CONNECT_PROBE = """
import errno, socket, sys
for target in sys.argv[1:]:
    if target.startswith("@"):
        s, address = socket.socket(socket.AF_UNIX), "\\0" + target[1:]
    elif target.startswith("/"):
        s, address = socket.socket(socket.AF_UNIX), target
    else:
        host, port = target.rsplit(":", 1)
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        address = (host.strip("[]"), int(port))
    s.settimeout(5)
    try:
        s.connect(address)
        print(target, "CONNECTED")
    except OSError as e:
        print(target, errno.errorcode.get(e.errno, e.errno))
"""


async def connect_from(sandbox: LocalSandbox, *targets: str) -> dict[str, str]:
    result = await sandbox.exec(["python3", "-c", CONNECT_PROBE, *targets], timeout=30)
    assert result.exit_code == 0, result.stderr
    return dict(line.split(" ", 1) for line in result.stdout.decode().splitlines())


def host_addresses() -> list[str]:
    """The host's own non-loopback IPv4 addresses (local /32 entries of the FIB)."""
    lines = Path("/proc/net/fib_trie").read_text().splitlines()
    found = {
        prev.split()[-1]
        for prev, line in zip(lines, lines[1:], strict=False)
        if "/32 host LOCAL" in line
    }
    return sorted(a for a in found if not a.startswith("127."))


def cgroup_file(sandbox: LocalSandbox, *names: str) -> Path:
    if sandbox.cgroup is None:
        pytest.skip("no cgroups on this host")
    for d in sandbox.cgroup.dirs:
        for name in names:
            if (d / name).exists():
                return d / name
    pytest.skip(f"no cgroup file {names} on this host")


# ------------------------------------------------------------------------------ network


@needs_python3
async def test_egress_to_a_public_address_fails_with_no_route(sandbox: LocalSandbox) -> None:
    got = await connect_from(sandbox, "192.0.2.1:80", "[2001:db8::1]:80")
    assert got == {"192.0.2.1:80": "ENETUNREACH", "[2001:db8::1]:80": "ENETUNREACH"}


@needs_python3
async def test_host_non_loopback_addresses_are_unreachable(sandbox: LocalSandbox) -> None:
    addresses = host_addresses()
    if not addresses:
        pytest.skip("this host has no non-loopback IPv4 address")
    got = await connect_from(sandbox, *(f"{a}:22" for a in addresses))
    assert set(got.values()) == {"ENETUNREACH"}


@needs_python3
async def test_host_loopback_services_are_unreachable(sandbox: LocalSandbox, tmp_path) -> None:
    tcp = socket.create_server(("127.0.0.1", 0))
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0reinforge-test-{os.getpid()}")
    path_socket = socket.socket(socket.AF_UNIX)
    path_socket.bind(str(tmp_path / "service.sock"))
    for listener in (tcp, abstract, path_socket):
        listener.listen()
        listener.setblocking(False)
    try:
        port = tcp.getsockname()[1]
        got = await connect_from(
            sandbox,
            f"127.0.0.1:{port}",
            f"@reinforge-test-{os.getpid()}",
            str(tmp_path / "service.sock"),
        )
        assert got == {
            f"127.0.0.1:{port}": "ECONNREFUSED",  # the sandbox's own, empty loopback
            f"@reinforge-test-{os.getpid()}": "ECONNREFUSED",  # abstract names are per netns
            str(tmp_path / "service.sock"): "ENOENT",  # the path is not in the view
        }
        for listener in (tcp, abstract, path_socket):
            with pytest.raises(BlockingIOError):
                listener.accept()  # nothing ever arrived on the host side
    finally:
        for listener in (tcp, abstract, path_socket):
            listener.close()


@needs_python3
async def test_sandbox_loopback_works_inside(sandbox: LocalSandbox) -> None:
    script = (
        "import socket; s = socket.create_server(('127.0.0.1', 0)); "
        "c = socket.create_connection(s.getsockname()); print('ok')"
    )
    assert (await sandbox.exec(["python3", "-c", script])).stdout == b"ok\n"


# ------------------------------------------------------------------------------ filesystem


async def test_host_paths_outside_the_view_do_not_exist(
    sandbox: LocalSandbox, provider: LocalProvider
) -> None:
    project = Path(reinforge.__file__).resolve().parents[1]
    paths = [str(project), "/root/.bashrc", "/home", str(provider.state_dir), "/run", "/sys"]
    result = await sandbox.exec(["ls", "-d", *paths])
    assert result.exit_code != 0 and result.stdout == b""
    assert result.stderr.count(b"No such file or directory") == len(paths)
    assert (await sandbox.exec(["ls", "/root"])).stdout == b""  # a private, empty home


async def test_another_sandbox_workspace_is_invisible(provider: LocalProvider) -> None:
    async with await provider.create() as a, await provider.create() as b:
        await b.write_files({"secret.txt": b"b-only", "/tmp/secret2": b"b-only"})
        got = await a.read_files(["secret.txt", "/tmp/secret2"])
        assert got == {"secret.txt": None, "/tmp/secret2": None}
        found = await a.exec("grep -rl b-only /workspace /tmp /root /var/tmp /dev/shm; echo done")
        assert found.stdout == b"done\n"


async def test_read_only_base_is_not_writable(sandbox: LocalSandbox) -> None:
    passwd = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
    attempts = {
        "touch /usr/bin/reinforge-escape": "read-only file system",
        "mkdir /new-top-level-dir": "read-only file system",
        # host-owned files: the owner check fails first, the read-only mount backs it up
        "echo x >> /etc/passwd": "permission denied",
        "mount -o remount,rw /usr": "permission denied",  # no CAP_SYS_ADMIN inside
        "mount -t tmpfs none /usr": "permission denied",
    }
    for command, message in attempts.items():
        result = await sandbox.exec(command)
        assert result.exit_code != 0, command
        assert message in result.stderr.decode().lower(), (command, result.stderr)
    mounts = (await sandbox.exec("cat /proc/self/mountinfo")).stdout.decode().splitlines()
    for line in mounts:
        point, options = line.split()[4], line.split()[5]
        if point in ("/", "/usr", "/etc") or point.startswith(("/usr/", "/etc/")):
            assert options.split(",")[0] == "ro", line
    assert not Path("/usr/bin/reinforge-escape").exists()
    assert hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest() == passwd


async def test_host_kernel_knobs_and_devices_are_out_of_reach(sandbox: LocalSandbox) -> None:
    # Both probes would be harmless on the host if they succeeded (dropping the page
    # cache; a device node in a tmpfs): nothing destructive is ever attempted.
    attempts = {
        "echo 1 > /proc/sys/vm/drop_caches": "permission denied",
        "mknod /tmp/disk b 8 0": "operation not permitted",
    }
    for command, message in attempts.items():
        result = await sandbox.exec(command)
        assert result.exit_code != 0 and message in result.stderr.decode().lower(), command


@needs_python3
async def test_chroot_escape_stays_inside_the_sandbox(sandbox: LocalSandbox) -> None:
    escape = (
        "import os\n"
        "os.makedirs('/tmp/jail', exist_ok=True)\n"
        "os.chroot('/tmp/jail')\n"
        "for _ in range(64): os.chdir('..')\n"
        "os.chroot('.')\n"
        "print(sorted(os.listdir('/')))\n"
    )
    result = await sandbox.exec(["python3", "-c", escape])
    assert result.exit_code == 0, result.stderr
    listing = result.stdout.decode()
    assert "'workspace'" in listing  # still the sandbox's root ...
    host_only = {p.name for p in Path("/").iterdir()} - {
        "usr",
        "bin",
        "sbin",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "etc",
        "dev",
        "proc",
        "tmp",
        "root",
        "var",
    }
    assert host_only and not any(f"'{name}'" in listing for name in host_only)  # ... not the host's


# ------------------------------------------------------------------------------ resources


async def test_fork_bomb_is_contained_by_the_pids_limit(provider: LocalProvider) -> None:
    async with await provider.create(SandboxSpec(pids=32)) as sandbox:
        # The bomb collapses within a second once forks fail; the long timeout is room for
        # a loaded host, so a slow collapse is not mistaken for an escape.
        result = await sandbox.exec("bomb() { bomb | bomb; }; bomb", timeout=60)
        assert result.exit_code != 0 and b"fork" in result.stderr.lower()
        assert len(pid_namespace_members(sandbox.init_pid)) <= 32
        events = cgroup_file(sandbox, "pids.events").read_text()
        assert int(events.split()[-1]) > 0  # the limit was hit, and held
        assert subprocess.run(["true"]).returncode == 0  # the host can still fork
        assert await answers_once_the_bomb_dies_out(sandbox)


async def answers_once_the_bomb_dies_out(sandbox: LocalSandbox) -> bool:
    """The bomb's first shell can return while orphans it left still fill the pids limit;
    until they die out, pid 1 refuses new commands with the reason, and then serves again.
    An orphan that never died would exhaust the attempts."""
    for _ in range(300):
        result = await sandbox.exec("echo alive", timeout=60)
        if result.stdout == b"alive\n":
            return True
        assert b"cannot start a process" in result.stderr, result
        await asyncio.sleep(0.2)
    return False


@needs_python3
async def test_a_full_pids_limit_fails_new_commands_and_pid_1_serves_on(
    provider: LocalProvider,
) -> None:
    # A program left running keeps the pids limit full of sleepers: pid 1 cannot fork the
    # next command. That command fails with the reason; were pid 1 to die instead, the
    # sandbox would die, and the sandbox process's doing would read as a sandbox failure.
    async with await provider.create(SandboxSpec(pids=16)) as sandbox:
        assert (await sandbox.exec(FILL_PIDS, timeout=60)).exit_code == 0
        for _ in range(3):
            await asyncio.sleep(0.5)  # the pid the last command freed is taken again
            result = await sandbox.exec("echo alive", timeout=60)
            assert (result.exit_code, result.stderr) == (
                126,
                b"reinforge-sandbox: cannot start a process: Resource temporarily unavailable\n",
            ), result


@needs_python3
async def test_memory_bomb_is_killed_within_the_limit(provider: LocalProvider) -> None:
    if not provider.capabilities.memory_limit:
        pytest.skip("no memory cgroup on this host (rlimit fallback is tested elsewhere)")
    limit = 128 << 20
    async with await provider.create(SandboxSpec(memory_bytes=limit)) as sandbox:
        touch_1gib = "x = bytearray(1 << 30); x[::4096] = b'1' * (1 << 18)"
        result = await sandbox.exec(["python3", "-c", touch_1gib])
        assert result.exit_code == 137  # SIGKILL from the OOM killer
        peak = cgroup_file(sandbox, "memory.max_usage_in_bytes", "memory.peak").read_text()
        assert int(peak) <= limit
        assert (await sandbox.exec("echo alive")).stdout == b"alive\n"


async def test_memory_bomb_via_tmpfs_is_bounded(provider: LocalProvider) -> None:
    if not provider.capabilities.memory_limit:
        pytest.skip("no memory cgroup on this host (tmpfs is then bounded by disk_bytes)")
    limit = 64 << 20
    spec = SandboxSpec(memory_bytes=limit, disk_bytes=1 << 30)
    async with await provider.create(spec) as sandbox:
        result = await sandbox.exec("head -c 300M /dev/zero > /tmp/fill")
        assert result.exit_code == 137  # SIGKILL from the OOM killer
        peak = cgroup_file(sandbox, "memory.max_usage_in_bytes", "memory.peak").read_text()
        assert int(peak) <= limit


async def test_disk_fill_is_bounded(provider: LocalProvider) -> None:
    async with await provider.create(SandboxSpec(disk_bytes=16 << 20)) as sandbox:
        result = await sandbox.exec("head -c 100M /dev/zero > /workspace/f")
        assert result.exit_code != 0 and b"No space left on device" in result.stderr
        size = await sandbox.exec("stat -c %s /workspace/f")
        assert int(size.stdout) <= 16 << 20
        more = await sandbox.exec("head -c 1M /dev/zero > /tmp/g")  # one budget for all
        assert b"No space left on device" in more.stderr


async def test_file_size_limit(provider: LocalProvider) -> None:
    async with await provider.create(SandboxSpec(file_size_bytes=1 << 20)) as sandbox:
        result = await sandbox.exec("head -c 2M /dev/zero > /tmp/f")
        assert result.exit_code == 128 + signal.SIGXFSZ


async def test_infinite_loop_is_killed_at_the_timeout(sandbox: LocalSandbox) -> None:
    result = await sandbox.exec("while :; do :; done", timeout=0.5)
    assert result.timed_out and result.exit_code == 124
    assert pid_namespace_members(sandbox.init_pid) == {sandbox.init_pid}


async def test_paused_sandbox_uses_no_cpu(sandbox: LocalSandbox) -> None:
    if not sandbox.capabilities.pause_exact:
        pytest.skip("no freezer cgroup: pause is best-effort SIGSTOP here")
    await sandbox.exec("while :; do :; done >/dev/null 2>&1 &")
    try:
        await sandbox.pause()
        frozen_from = namespace_cpu_ticks(sandbox)
        await asyncio.sleep(0.3)
        assert namespace_cpu_ticks(sandbox) == frozen_from
        await sandbox.resume()
        thawed_from = namespace_cpu_ticks(sandbox)
        for _ in range(200):  # and the same probe does see CPU once thawed
            await asyncio.sleep(0.01)
            if namespace_cpu_ticks(sandbox) > thawed_from:
                break
        assert namespace_cpu_ticks(sandbox) > thawed_from
    finally:
        await sandbox.exec("kill -9 -1")


# ------------------------------------------------------------------------------ processes


async def test_setsid_and_daemonized_children_are_gone_after_close(
    provider: LocalProvider,
) -> None:
    sandbox = await provider.create()
    await sandbox.exec("setsid sleep 1001 & (sleep 1002 &) & nohup sleep 1003 >/dev/null 2>&1 &")
    members = pid_namespace_members(sandbox.init_pid)
    assert len(members) >= 4
    await sandbox.close()
    assert not [pid for pid in members if host_pid_alive(pid)]


async def test_sandboxes_cannot_see_or_signal_each_other(provider: LocalProvider) -> None:
    async with await provider.create() as a, await provider.create() as b:
        await b.exec("sleep 1234 &")
        victim = max(pid_namespace_members(b.init_pid))
        seen = await a.exec("ps -e -o args=")
        assert b"sleep 1234" not in seen.stdout
        killed = await a.exec(f"kill -9 {victim}")
        assert killed.exit_code != 0 and b"No such process" in killed.stderr
        assert host_pid_alive(victim)


async def test_pid1_cannot_be_inspected_or_traced(sandbox: LocalSandbox) -> None:
    # pid 1 holds the socket to the manager: its fds, memory and root must stay closed.
    for probe in ("ls /proc/1/fd", "cat /proc/1/environ", "ls /proc/1/root/"):
        result = await sandbox.exec(probe)
        assert result.exit_code != 0 and b"Permission denied" in result.stderr, probe
    assert (await sandbox.exec("kill -9 1; echo survived")).stdout == b"survived\n"
    assert (await sandbox.exec("echo alive")).stdout == b"alive\n"


CRASHING_PARENT = """
import asyncio, json, os, sys
from pathlib import Path
from reinforge.sandbox import LocalProvider
from reinforge.sandbox.reaper import pid_namespace_members

async def main():
    provider = LocalProvider(state_dir=Path(sys.argv[1]))
    sandboxes = await asyncio.gather(*(provider.create() for _ in range(32)))
    await asyncio.gather(*(s.exec("setsid sleep 1000 & (sleep 1001 &)") for s in sandboxes))
    for _ in range(3000):  # on 2 busy cores the last forks can lag behind the shell's exit
        members = [pid_namespace_members(s.init_pid) for s in sandboxes]
        if all(len(m) >= 3 for m in members):
            break
        await asyncio.sleep(0.01)
    pids = sorted(p for m in members for p in m)
    groups = [str(d) for s in sandboxes for d in (s.cgroup.dirs if s.cgroup else [])]
    counts = [
        (len(m), s.init_pid, os.path.exists(f"/proc/{s.init_pid}"))
        for m, s in zip(members, sandboxes)
    ]
    print(json.dumps({"pids": pids, "groups": groups, "counts": counts}), flush=True)
    await asyncio.sleep(1000)

asyncio.run(main())
"""


def test_sigkilled_parent_leaves_nothing_after_the_next_start(tmp_path) -> None:
    state = tmp_path / "state"
    env = dict(os.environ, PYTHONPATH=str(Path(reinforge.__file__).resolve().parents[1]))
    parent = subprocess.Popen(
        [sys.executable, "-c", CRASHING_PARENT, str(state)], stdout=subprocess.PIPE, env=env
    )
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line, "the parent failed to start 32 sandboxes"
        started = json.loads(line)
        assert len(started["pids"]) >= 32 * 3, started["counts"]
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    assert len(list(state.iterdir())) == 32  # left behind by the crash
    provider = LocalProvider(state_dir=state)  # the next start reaps
    assert provider.reaped >= 32
    assert list(state.iterdir()) == []
    assert not [pid for pid in started["pids"] if host_pid_alive(pid)]
    assert not [g for g in started["groups"] if Path(g).exists()]


SECRET_SCAN = """
read -r secret
found=
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
  text=$(tr '\\0' '\\n' <"$f" 2>/dev/null)
  case "$text" in *"$secret"*) found="$found $f" ;; esac
done
case "$(env)" in *"$secret"*) found="$found exec-env" ;; esac
echo "found:$found"
"""
"""Lists each process entry that holds the secret; it comes on stdin and is matched by
the shell itself, so no argv in the scan holds it."""


def parent_pid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def test_no_variable_of_the_host_process_reaches_any_sandbox_process(tmp_path) -> None:
    # The trainer's environment holds tracker, judge and cloud keys: a sandbox process must
    # not read them, in its own environment or in another process's /proc entry. Every
    # sandbox process descends from the provider's helper, and pid 1's read and write
    # builtins are forks of it without an exec, so they show its environment block.
    marker = "planted-trainer-secret-9f3b"
    os.environ["REINFORGE_TEST_PLANTED_SECRET"] = marker
    try:
        provider = LocalProvider(state_dir=tmp_path / "state")  # its helper starts now
        async with await provider.create() as sandbox:
            assert sandbox.init_pid is not None
            outer = parent_pid(sandbox.init_pid)
            for pid in (sandbox.init_pid, outer, parent_pid(outer)):  # pid 1, outer, helper
                assert marker.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
            scan = await sandbox.exec(SECRET_SCAN, stdin=marker.encode() + b"\n")
            assert scan.stdout == b"found:\n", scan
        await provider.aclose()
    finally:
        del os.environ["REINFORGE_TEST_PLANTED_SECRET"]


ANOTHER_UID_SEES = """
import os, subprocess, sys
LIST = "import os; print(*sorted(n for n in os.listdir('/proc') if n.isdigit()))"
seen = subprocess.run(
    [sys.executable, "-c", LIST],
    user=65534, group=65534, extra_groups=[], capture_output=True, text=True, check=True,
)
print(" ".join(sorted(n for n in os.listdir("/proc") if n.isdigit())))
print(seen.stdout.strip())
"""
"""Root's view of /proc, then nobody's, from one sandbox: root's own probe runs both."""


@needs_python3
async def test_another_uid_sees_no_root_process_in_the_sandbox(sandbox: LocalSandbox) -> None:
    # A grader runs the candidate as nobody: the grader's argv and environment (the test
    # script, the call it checks) must not be in the candidate's /proc.
    mapped = await sandbox.exec(["cat", "/proc/self/uid_map"])
    ranges = [line.split() for line in mapped.stdout.decode().splitlines()]
    assert any(int(inside) <= 65534 < int(inside) + int(n) for inside, _, n in ranges), ranges
    result = await sandbox.exec(["python3", "-c", ANOTHER_UID_SEES], timeout=30)
    assert result.exit_code == 0, result.stderr
    root_sees, nobody_sees = (line.split() for line in result.stdout.decode().splitlines())
    assert "1" in root_sees and len(root_sees) >= 2  # pid 1 and root's probe, at least
    assert len(nobody_sees) == 1 and nobody_sees[0] not in root_sees  # its own process only
