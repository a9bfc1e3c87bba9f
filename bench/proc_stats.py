"""What the processes of a deployment on this host cost, from /proc: the host's busy time,
each role's CPU (router, decode, prefill, the supervisor, and this process as the client),
and per thread the kernel's scheduler statistics (time on a core to the nanosecond, time
waiting for one)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def host_busy() -> float:
    """CPU seconds every core of the host has been busy so far (/proc/stat: user, nice,
    system, irq, softirq, steal)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(root: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of `root`'s process tree by role (router, decode,
    prefill, supervisor) from /proc (in clock ticks, ended threads included), and of this
    process (the client) to the microsecond."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {"client": time.process_time()}
    for pid, role in _tree_roles(root).items():
        try:  # after the command: state, ppid, ..., utime (12th), stime (13th)
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def thread_seconds(root: int, field: int) -> dict[str, float]:
    """Summed over the live threads of `root`'s process tree (by role) and of this process
    (the client), a field of /proc/PID/task/TID/schedstat in seconds: 0 their time on a
    core so far, 1 their time runnable but waiting for a core (what contention cost them,
    which CPU time does not show); field 2, the times they got a core, is a count. A
    thread that has ended no longer counts. `decode_http`: the decode processes' main
    threads alone (their HTTP servers); `router_main`, `client_main`: the event loops'
    threads alone (without ZeroMQ's and the executors' threads)."""
    scale = 1.0 if field == 2 else 1e-9
    me = os.getpid()
    out = {"client": _task_stat(me, field), "client_main": _task_stat(me, field, me)}
    for pid, role in _tree_roles(root).items():
        out[role] = out.get(role, 0.0) + _task_stat(pid, field)
        if role == "decode":  # its main thread runs the HTTP server (uvicorn)
            out["decode_http"] = out.get("decode_http", 0.0) + _task_stat(pid, field, pid)
        if role == "router":
            out["router_main"] = out.get("router_main", 0.0) + _task_stat(pid, field, pid)
    return {k: v * scale for k, v in out.items()}


def _task_stat(pid: int, field: int, tid: int | None = None) -> int:
    """Over the process's threads, or over thread `tid` alone (in the field's unit)."""
    total = 0
    tasks = [Path(f"/proc/{pid}/task/{tid}")] if tid else Path(f"/proc/{pid}/task").glob("*")
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[field])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended, or the kernel keeps no schedstat
    return total


def _tree_roles(root: int) -> dict[int, str]:
    """The role of each process of `root`'s tree, from its command line."""
    parents = {}
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit():
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
    tree, frontier = set(), {root}
    while frontier:
        tree |= frontier
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - tree
    out = {}
    for pid in tree:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        roles = ("router", "decode", "prefill")
        out[pid] = next((r for r in roles if f"tandem.{r}" in cmd), "serve")
    return out


def time_slice(seconds: float = 1.0) -> float:
    """The kernel's time slice here: how long, on average, a thread that never waits keeps
    a core while as many others as twice the cores want one (processes that only spin,
    their time on a core over the times they got one, from schedstat)."""
    spin = (
        f"import time\nend = time.perf_counter() + {seconds}\nwhile time.perf_counter() < end: pass"
    )
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2 * os.cpu_count())]
    time.sleep(seconds * 0.9)  # all of them still spinning
    run, slices = (sum(_task_stat(p.pid, field) for p in procs) for field in (0, 2))
    for p in procs:
        p.wait()
    return run / 1e9 / max(slices, 1)
