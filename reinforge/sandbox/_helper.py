"""Sandbox helper: `python -I -S _helper.py SOCKET_FD MANAGER_PID`; the package imports constants.

It starts as a *zygote*: one per provider, with everything imported, that forks one
*outer* process per sandbox on request (a fork costs ~1 ms, a Python start ~30 ms).
The outer joins the sandbox's cgroups, unshares the user/mount/net/ipc/uts/cgroup/pid
namespaces, lets the manager write its uid map, forks pid 1 and then only waits for it
(so the pidfd the manager holds signals exactly when the sandbox is gone). *pid 1* builds
the filesystem, pivots into it, drops capabilities and serves requests from the manager
over a SOCK_SEQPACKET socket: it forks every command, so every process of the sandbox
shares its namespaces and cgroups, and it reaps orphans.

It is stdlib-only and imports everything before pivot_root: after that the host's Python
library is gone. Startup time is the create latency, so imports are kept to the minimum.
Manager -> helper messages are marshal (the manager is trusted); helper -> manager
messages are fixed structs (the manager never unmarshals anything from a sandbox).
"""

import ctypes
import errno
import fcntl
import marshal
import os
import resource
import select
import signal
import socket
import stat
import struct
import sys

HEADER = struct.Struct("<BIq")  # kind, request id, value
K_MAP, K_PID, K_READY, K_FAIL, K_EXITED = 1, 2, 3, 4, 5
READ_FRAME = struct.Struct("<bQ")  # status (0 ok, -1 missing), length
WRITE_FRAME = struct.Struct("<HIQ")  # path length, mode, size

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x20000, 0x2000000, 0x4000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x8000000,
    0x10000000,
    0x20000000,
    0x40000000,
)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME = 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
# Docker's default capability set: root inside can chown, setuid, bind low ports...
# but cannot mount, remount the read-only base writable, ptrace or load anything.
KEPT_CAPS = (0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31)
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")

libc = ctypes.CDLL(None, use_errno=True)


def check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src, target, fstype, flags, data=None):
    enc = [None if s is None else os.fsencode(s) for s in (src, target, fstype, data)]
    check(libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def send(sock, kind, req=0, value=0, tail=b""):
    sock.send(HEADER.pack(kind, req, value) + tail)


# ---------------------------------------------------------------------------- outer


def zygote(fd, manager):
    """Fork an outer per request; reply with its pid and a pidfd (race-free waits/kills)."""
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    if os.getppid() != manager:  # the manager died before pdeathsig was armed
        os._exit(1)
    sock = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        for ready, _ in poller.poll():
            if ready == wake_r:
                drain(wake_r)
                reap_all()
                continue
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2)
            if not msg:  # the manager is gone
                os._exit(0)
            cfg = marshal.loads(msg)  # config via the socket: argv would be visible inside
            cfg["parent"] = os.getpid()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for own in (wake_r, wake_w):
                    os.close(own)
                sock.close()
                os.dup2(fds[1], 1)
                os.dup2(fds[1], 2)
                os.close(fds[1])
                outer(socket.socket(fileno=fds[0]), cfg)
            for passed in fds:
                os.close(passed)
            pidfd = os.pidfd_open(pid)
            socket.send_fds(sock, [HEADER.pack(K_PID, 0, pid)], [pidfd])
            os.close(pidfd)


def drain(fd):
    while True:
        try:
            if not os.read(fd, 512):
                return
        except BlockingIOError:
            return


def reap_all():
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def outer(sock, cfg):
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    if os.getppid() != cfg["parent"]:  # the zygote died before pdeathsig was armed
        os._exit(1)
    try:
        for procs in cfg["cgroup_procs"]:
            with open(procs, "w") as f:
                f.write("0")
        check(libc.unshare(cfg["flags"]), "unshare")
        send(sock, K_MAP)
        go, fds, _, _ = socket.recv_fds(sock, 16, 1)
        if go != b"M":
            os._exit(1)
        cfg["rootfs_fd"] = fds[0] if fds else None
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        if cfg["setgroups"]:
            os.setgroups([])
        pid = os.fork()
    except OSError as error:
        send(sock, K_FAIL, tail=str(error).encode())
        os._exit(1)
    if pid == 0:
        init(cfg, sock)
    send(sock, K_PID, value=pid)
    sock.close()
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


# ---------------------------------------------------------------------------- pid 1 setup


def mount_flags(path):
    """Flags a read-only remount must keep: the kernel locks them in a user namespace."""
    st = os.statvfs(path)
    flags = 0
    for st_bit, ms_bit in (
        (2, MS_NOSUID),
        (4, MS_NODEV),
        (8, MS_NOEXEC),
        (1024, MS_NOATIME),
        (2048, MS_NODIRATIME),
        (4096, MS_RELATIME),
    ):
        if st.f_flag & st_bit:
            flags |= ms_bit
    return flags


def unescape(field):
    """mountinfo writes space, tab, newline and backslash as \\ooo octal escapes."""
    parts = field.split("\\")
    out = [parts[0]]
    for part in parts[1:]:
        out.append(chr(int(part[:3], 8)) + part[3:])
    return "".join(out)


def mounts_under(target):
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = unescape(line.split()[4])
            if point == target or point.startswith(target + "/"):
                found.append(point)
    return found


def bind_readonly(src, target):
    mount(src, target, None, MS_BIND | MS_REC)
    for point in mounts_under(target):
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | mount_flags(point)
        mount(None, point, None, flags)


def build_host_view(cfg, root):
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for name in cfg["host_dirs"]:
        src = "/" + name
        if os.path.islink(src):
            os.symlink(os.readlink(src), f"{root}/{name}")
        elif os.path.isdir(src):
            os.mkdir(f"{root}/{name}")
            bind_readonly(src, f"{root}/{name}")
    # One size-capped tmpfs holds every writable directory, so `disk_bytes` is one budget.
    rw = f"{root}/.rw"
    os.mkdir(rw)
    mount("tmpfs", rw, "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['disk_bytes']},mode=755")
    writable = {"tmp": 0o1777, "root": 0o700, "var/tmp": 0o1777, "dev/shm": 0o1777}
    for path in (cfg["workdir"], *cfg.get("writable_dirs", ())):
        top = path.strip("/").split("/")[0]
        if top not in ("tmp", "root", "var"):  # the manager rejected read-only places
            writable[top] = 0o755
    for name, mode in writable.items():
        os.makedirs(f"{rw}/{name}")
        os.chmod(f"{rw}/{name}", mode)
        if name != "dev/shm":  # bound by build_dev_and_proc
            os.makedirs(f"{root}/{name}")
            mount(f"{rw}/{name}", f"{root}/{name}", None, MS_BIND)
    for path in (cfg["workdir"], *cfg.get("writable_dirs", ())):
        os.makedirs(f"{root}{path}", exist_ok=True)


def build_rootfs_view(cfg, root):
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['disk_bytes']},mode=755")
    for name in ("upper", "work", "merged", "rw/dev/shm"):
        os.makedirs(f"{root}/{name}")
    os.chmod(f"{root}/rw/dev/shm", 0o1777)
    lower = f"/proc/self/fd/{cfg['rootfs_fd']}"
    options = f"lowerdir={lower},upperdir={root}/upper,workdir={root}/work"
    mount("overlay", f"{root}/merged", "overlay", MS_NOSUID, options)
    os.close(cfg["rootfs_fd"])  # it reaches the host tree: no process may inherit it
    for path in (cfg["workdir"], *cfg.get("writable_dirs", ())):
        os.makedirs(f"{root}/merged{path}", exist_ok=True)
    return f"{root}/merged", f"{root}/rw"


def build_dev_and_proc(root, rw):
    os.makedirs(f"{root}/dev", exist_ok=True)
    os.makedirs(f"{root}/proc", exist_ok=True)
    dev = f"{root}/dev"
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for name in DEV_NODES:
        open(f"{dev}/{name}", "w").close()
        mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm")
    mount(f"{rw}/dev/shm", f"{dev}/shm", None, MS_BIND)
    # Another uid's processes are invisible to any uid but root's group: a candidate a
    # grader runs as nobody cannot read the grader's argv or environment in /proc.
    options = "hidepid=invisible,gid=0"
    mount("proc", f"{root}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, options)


def loopback_up():
    """`ip link set lo up` without needing `ip` in the base (SIOCGIFFLAGS/SIOCSIFFLAGS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(s, 0x8913, req))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sh22x", b"lo", flags | 1))


def drop_capabilities():
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        if cap not in KEPT_CAPS:
            check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop cap {cap}")
    keep = sum(1 << c for c in KEPT_CAPS)
    header = struct.pack("II", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = struct.pack("6I", keep & 0xFFFFFFFF, keep & 0xFFFFFFFF, 0, keep >> 32, keep >> 32, 0)
    check(libc.capset(header, data), "capset")


def load_libseccomp():
    """Loaded before pivot_root: the new root may not contain libseccomp."""
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    return lib


def install_seccomp(lib, names):
    """Deny-list filter: EPERM for each listed syscall, everything else allowed."""
    ctx = lib.seccomp_init(0x7FFF0000)  # SCMP_ACT_ALLOW
    for name in names:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr >= 0:  # unknown on this architecture: nothing to deny
            check(lib.seccomp_rule_add(ctx, 0x00050000 | 1, nr, 0), f"seccomp {name}")
    check(lib.seccomp_load(ctx), "seccomp_load")


def setup(cfg):
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "dumpable")  # no ptrace of pid 1
    seccomp_lib = load_libseccomp() if cfg["seccomp"] else None
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Build the new root on the host's /tmp (in our private mount namespace only): it
    # always exists and is world-traversable, unlike the manager's state directory.
    root = "/tmp"
    if not cfg["rootfs"]:
        build_host_view(cfg, root)
        rw = f"{root}/.rw"
    else:
        root, rw = build_rootfs_view(cfg, root)
    build_dev_and_proc(root, rw)
    if cfg["hostname"]:
        name = cfg["hostname"].encode()
        check(libc.sethostname(name, len(name)), "sethostname")
    if cfg["flags"] & CLONE_NEWNET:
        loopback_up()
    # pivot_root, never chroot: chroot leaves the host root reachable via `..`.
    os.chdir(root)
    nr = SYS_PIVOT_ROOT[os.uname().machine]
    check(libc.syscall(nr, b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    if not cfg["rootfs"]:
        check(libc.umount2(b"/.rw", MNT_DETACH), "umount staging")
        os.rmdir("/.rw")
    # While the root is still writable (for the mount points) and pid 1 may mount: once
    # the capabilities are gone, nothing inside can unmount, move or remove these.
    for path, size in cfg["own_disks"].items():
        os.makedirs(path, exist_ok=True)
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=755")
    if not cfg["rootfs"]:
        mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    if cfg["drop_caps"]:
        drop_capabilities()
    if seccomp_lib is not None:
        install_seccomp(seccomp_lib, cfg["seccomp"])


# ---------------------------------------------------------------------------- pid 1 serving


def open_regular(path, flags):
    """Open `path` only as a regular file. Opening a FIFO waits until something opens its
    other end, and a device may never answer: the builtin, and the agent's turn, would
    hang on it. O_NONBLOCK opens either at once (or fails, ENXIO, for a FIFO that no one
    reads), and the file is refused before anything is read or written."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as error:
        if error.errno != errno.ENXIO:
            raise
        fd = -1
    if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd >= 0:
            os.close(fd)
        raise OSError(errno.EINVAL, f"{path}: not a regular file")
    os.set_blocking(fd, True)
    return fd


def builtin_write():
    data = sys.stdin.buffer.read()
    pos = 0
    while pos < len(data):
        n, mode, size = WRITE_FRAME.unpack_from(data, pos)
        pos += WRITE_FRAME.size
        path = data[pos : pos + n].decode()
        pos += n
        os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
        with os.fdopen(open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
            f.write(data[pos : pos + size])
        os.chmod(path, mode)
        pos += size
    return 0


def builtin_read(paths, max_bytes):
    out = sys.stdout.buffer
    for path in paths:
        try:
            with os.fdopen(open_regular(path, os.O_RDONLY), "rb") as f:
                content = f.read(max_bytes)
        except OSError:
            out.write(READ_FRAME.pack(-1, 0))
            continue
        out.write(READ_FRAME.pack(0, len(content)) + content)
    out.flush()
    return 0


def execvpe(argv, env):
    """os.execvpe imports `warnings` lazily, which no longer exists after pivot_root."""
    name = argv[0]
    if "/" in name:
        os.execve(name, argv, env)
    error = FileNotFoundError(2, "command not found")
    for directory in env.get("PATH", "/usr/bin:/bin").split(":"):
        try:
            os.execve(f"{directory or '.'}/{name}", argv, env)
        except (FileNotFoundError, NotADirectoryError):
            pass
        except PermissionError as denied:  # like execvp: remember it, keep searching
            error = denied
    raise error


def child(req, fds):
    """In the forked child: become the command. Never returns."""
    what = req["argv"][0] if req.get("argv") else req.get("builtin")
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        stdin = fds[0] if req["stdin"] else os.open("/dev/null", os.O_RDONLY)
        for target, fd in enumerate((stdin, fds[-2], fds[-1])):
            os.dup2(fd, target)
        os.closerange(3, 65536)
        # Dumpable again (exec would do it anyway) so /proc/self is ours; safe only now
        # that the socket to the manager is closed.
        check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
        # The OOM killer must pick a command, never pid 1 (which would end the sandbox).
        # Raising is unprivileged; lowering it back needs CAP_SYS_RESOURCE, dropped here.
        adj = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        os.write(adj, b"1000")
        os.close(adj)
        os.umask(0o022)
        for which, soft, hard in req["rlimits"]:
            resource.setrlimit(which, (soft, hard))
        what = f"cwd {req['cwd']}"
        os.chdir(req["cwd"])
        what = req["argv"][0] if req.get("argv") else req.get("builtin")
        builtin = req.get("builtin")
        if builtin == "write":
            os._exit(builtin_write())
        if builtin == "read":
            os._exit(builtin_read(req["paths"], req["max_bytes"]))
        execvpe(req["argv"], req["env"])
    except OSError as error:
        os.write(2, f"reinforge-sandbox: {what}: {error.strerror}\n".encode())
        os._exit(127 if error.errno == 2 else 126)
    except BaseException as error:  # noqa: BLE001  (report anything, never run on)
        os.write(2, f"reinforge-sandbox: {error!r}\n".encode())
    os._exit(126)


def serve(sock):
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a sandbox process must not stop pid 1
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    running = {}  # pid -> request id
    send(sock, K_READY)
    while True:
        for fd, _ in poller.poll():
            if fd == wake_r:
                drain(wake_r)
                reap(sock, running)
                continue
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 4)
            if not msg:  # the manager is gone: the sandbox goes with it
                os._exit(0)
            req = marshal.loads(msg)
            if req["op"] == "kill":
                kill(running, req["id"])
                continue
            try:
                pid = os.fork()
            except OSError as error:
                refuse(sock, req, fds, error)
                continue
            if pid == 0:
                child(req, fds)
            for fd_ in fds:
                os.close(fd_)
            running[pid] = req["id"]


def refuse(sock, req, fds, error):
    """A command that cannot start (its sandbox's pids limit is full, say, under a fork
    bomb) fails with the reason, and pid 1 goes on serving: were pid 1 to die, the
    sandbox would die with it, and what a sandbox process did would end as an error of
    the sandbox rather than as that process's failure."""
    try:
        os.write(fds[-1], f"reinforge-sandbox: cannot start a process: {error.strerror}\n".encode())
    except OSError:
        pass
    for fd_ in fds:
        os.close(fd_)
    send(sock, K_EXITED, req["id"], 126)


def kill(running, req_id):
    for pid, rid in running.items():
        if rid == req_id:
            for killer in (os.killpg, os.kill):
                try:
                    killer(pid, signal.SIGKILL)
                except OSError:
                    pass


def reap(sock, running):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        req_id = running.pop(pid, None)
        if req_id is not None:
            send(sock, K_EXITED, req_id, os.waitstatus_to_exitcode(status))


def init(cfg, sock):
    try:
        setup(cfg)
    except Exception as error:  # noqa: BLE001  (any setup failure is reported, then exit)
        send(sock, K_FAIL, tail=repr(error).encode())
        os._exit(1)
    serve(sock)
    os._exit(0)


if __name__ == "__main__":
    zygote(int(sys.argv[1]), int(sys.argv[2]))
