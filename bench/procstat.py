"""What the bench reads from /proc, and how it starts and stops the processes it owns.

CPU time (user+sys), run-queue wait (schedstat), RSS and open fds are summed over a process tree
(the target may be `bash -c` around a Python process, or a server with workers). Processes are
started in their own session (= process group and, with sched_autogroup, their own autogroup),
pinned with `taskset`, niced; they are stopped by signalling that group only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo and len(out) < 1000:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
        except OSError:
            pass
    return out


def tree_cpu_s(pid: int) -> float:
    """user+sys seconds of the live tree (plus the reaped children of each process)."""
    total = 0
    for p in tree(pid):
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in f[11:15])
        except (OSError, IndexError, ValueError):
            pass
    return total / TICK


def thread_cpu(pid: int) -> dict[str, float]:
    """{"<tid> <name>": user+sys seconds} for every thread of one process."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        try:
            head, _, rest = Path(f"/proc/{pid}/task/{t}/stat").read_text().rpartition(")")
            f = rest.split()
            out[f"{t} {head.split('(', 1)[1]}"] = (int(f[11]) + int(f[12])) / TICK
        except (OSError, IndexError, ValueError):
            pass
    return out


def tree_wait_s(pid: int) -> float:
    """Run-queue wait of every thread of the tree: runnable, but another task had the CPU."""
    total = 0
    for p in tree(pid):
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                total += int(Path(f"/proc/{p}/task/{t}/schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def tree_rss_kb(pid: int) -> int:
    total = 0
    for p in tree(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE_KB
    return total


def tree_fds(pid: int) -> int:
    total = 0
    for p in tree(pid):
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{p}/fd"))
    return total


def _tcp_table() -> dict[int, tuple[int, int, int]]:
    """{socket inode: (local port, remote port, state)} from /proc/net/tcp and tcp6."""
    out = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9:
                out[int(f[9])] = (int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16), int(f[3], 16))
    return out


def fd_breakdown(pid: int, server_port: int, upstream_ports: set[int]) -> dict[str, int]:
    """Open fds of one process by kind: client-side connections (local port = the server's), upstream
    connections (remote port = an engine's), other sockets (listeners, ...), and fds that are not sockets."""
    tcp = _tcp_table()
    out = {"total": 0, "client": 0, "upstream": 0, "other_sockets": 0, "not_sockets": 0}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in names:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        out["total"] += 1
        if not link.startswith("socket:["):
            out["not_sockets"] += 1
            continue
        lport, rport, state = tcp.get(int(link[8:-1]), (0, 0, 0))
        if state != 0x0A and lport == server_port:  # 0x0A = LISTEN
            out["client"] += 1
        elif rport in upstream_ports:
            out["upstream"] += 1
        else:
            out["other_sockets"] += 1
    return out


def main_pid(pid: int) -> int:
    """The process of the tree holding the most fds (the server under a `bash -c` wrapper)."""
    best, most = pid, -1
    for p in tree(pid):
        try:
            n = len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            continue
        if n > most:
            best, most = p, n
    return best


def fd_limits(pid: int) -> tuple[int, int]:
    """(soft, hard) RLIMIT_NOFILE of a process, from /proc/<pid>/limits."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            f = line.split()
            return int(f[3]), int(f[4])
    raise RuntimeError(f"no 'Max open files' line in /proc/{pid}/limits")


def hwm_kb(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def cpu_times() -> dict[str, tuple[int, int]]:
    """{cpu: (busy, total)} jiffies per CPU."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3].isdigit():
            f = line.split()
            v = [int(x) for x in f[1:9]]
            out[f[0][3:]] = (sum(v) - v[3] - v[4], sum(v))
    return out


def busy_pct(a: dict[str, tuple[int, int]], b: dict[str, tuple[int, int]], cpu: str) -> float:
    db, dt = b[cpu][0] - a[cpu][0], b[cpu][1] - a[cpu][1]
    return 100.0 * db / dt if dt else 0.0


def set_autogroup_nice(pid: int | str, nice: int) -> int | None:
    """With sched_autogroup on, `nice` only ranks tasks inside one session, and sessions share a CPU by
    their autogroup's nice: give the sessions we create (and our own) the same nice as their tasks.
    Returns the previous value, None where there are no autogroups (or no permission)."""
    try:
        path = Path(f"/proc/{pid}/autogroup")
        prev = int(path.read_text().split()[-1])
        path.write_text(str(nice))
        return prev
    except (OSError, ValueError, IndexError):
        return None


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is `pgid` (read from /proc, so never a guess)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def http(url: str, data: bytes | None = None, headers: dict[str, str] | None = None, timeout: float = 5.0):
    req = urllib.request.Request(url, data=data, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


class Proc:
    """A command run as `nice -n N taskset -c CPU bash -c CMD` in a new session, output to a log file."""

    def __init__(self, cmd: str, cpu: str, env: dict[str, str], log: Path, nice: int = 0) -> None:
        self.cmd = cmd
        self.log = log.open("wb")
        argv = ["taskset", "-c", cpu, "bash", "-c", cmd]
        if nice:
            argv = ["nice", "-n", str(nice), *argv]
        self.p = subprocess.Popen(
            argv, env=env, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        self.pid = self.p.pid
        if nice:
            set_autogroup_nice(self.pid, nice)

    def alive(self) -> bool:
        return self.p.poll() is None

    def stop(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            if self.p.poll() is not None:
                break
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.p.wait(8 if sig == signal.SIGINT else 5)
        if group_members(self.pid):  # stragglers of our own group (workers, wrappers)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        self.log.close()


class Sampler(threading.Thread):
    """Samples RSS and open fds of a process tree every `every` seconds; peaks per window."""

    def __init__(self, pid: int, every: float = 0.1, fds: bool = False) -> None:
        super().__init__(daemon=True)
        self.pid, self.every, self.want_fds = pid, every, fds
        self.peak_kb = self.win_peak_kb = self.win_peak_fds = 0
        self._stop = threading.Event()

    def window(self) -> None:
        self.win_peak_kb = self.win_peak_fds = 0

    def run(self) -> None:
        while not self._stop.wait(self.every):
            kb = tree_rss_kb(self.pid)
            self.peak_kb = max(self.peak_kb, kb)
            self.win_peak_kb = max(self.win_peak_kb, kb)
            if self.want_fds:
                self.win_peak_fds = max(self.win_peak_fds, tree_fds(self.pid))

    def stop(self) -> None:
        self._stop.set()


def wait_until(pred, timeout: float, every: float = 0.2) -> bool:
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if pred():
            return True
        time.sleep(every)
    return bool(pred())
