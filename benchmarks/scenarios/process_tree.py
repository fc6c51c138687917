"""CPU of a whole process tree over an interval: the mount's main process, every process under
it, and, apart, the harness and the rest of the machine.

A mount served by several processes spends its CPU in all of them, so "the daemon's CPU" is
the tree's: the root and its descendants as found at start and at stop (a process that appears
in between is counted from zero; one that exits in between is lost, and `lost` says so). The
root's own CPU is kept apart: in a multi-process mount it is the serial part, the work every
request funnels through. `processes` is the most processes the tree had at start or stop.

The tree's context switches are counted too, over every thread: *voluntary* ones are waits (for
the next FUSE request, a lock, a reply), *involuntary* ones are preemptions, where the kernel
took the core away to run something else. On a machine with fewer cores than busy threads
(this 2-core VM, with the readers beside the daemon) preemptions grow and each one costs the
preempted process its warm caches: CPU per file rises with no more work done.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil


@dataclass(frozen=True, slots=True)
class TreeUsage:
    """What one interval measured (CPU in seconds, user + system)."""

    wall_s: float
    #: the root and every process under it
    tree_cpu_s: float
    #: the root alone: the serial part when the tree serves one mount
    root_cpu_s: float
    #: the process that runs the readers (this one)
    harness_cpu_s: float
    #: everything else on the machine (other users, kernel threads)
    others_cpu_s: float
    processes: int
    #: processes of the tree that exited during the interval (their CPU is missing)
    lost: int
    #: summed VmRSS of the tree at stop, bytes
    tree_rss_bytes: int
    #: context switches of the tree's threads: waits, and preemptions (module docstring)
    voluntary_switches: int = 0
    involuntary_switches: int = 0


def _busy_s() -> float:
    """CPU seconds the machine has been busy since boot, all cores."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def tree_processes(root: psutil.Process) -> dict[tuple[int, float], psutil.Process]:
    """`root` and every process under it, by (pid, start time): a reused pid is another
    process."""
    procs = [root]
    try:
        procs += root.children(recursive=True)
    except psutil.Error:
        pass
    out: dict[tuple[int, float], psutil.Process] = {}
    for proc in procs:
        try:
            out[(proc.pid, proc.create_time())] = proc
        except psutil.Error:
            continue
    return out


def context_switches(pid: int) -> tuple[int, int] | None:
    """(voluntary, involuntary) context switches of every thread of process `pid` so far
    (/proc/<pid>/status counts its main thread only); None if it is gone."""
    voluntary = involuntary = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as status:
                for line in status:
                    if line.startswith("voluntary_ctxt_switches:"):
                        voluntary += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        involuntary += int(line.split()[1])
        except OSError:
            continue  # a thread that ended between the listing and the read
    return voluntary, involuntary


def cpu_s(proc: psutil.Process) -> float | None:
    """User + system CPU seconds of one process; None if it is gone."""
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


class TreeMeter:
    """`start()`, then `stop()` -> `TreeUsage` of the tree rooted at `root_pid`."""

    def __init__(self, root_pid: int) -> None:
        self._root = psutil.Process(root_pid)
        self._me = psutil.Process(os.getpid())
        self._start: dict[tuple[int, float], float] = {}
        self._switches0: dict[tuple[int, float], tuple[int, int]] = {}
        self._root0 = self._me0 = self._busy0 = self._t0 = 0.0
        self._count0 = 0

    def _tree(self) -> dict[tuple[int, float], psutil.Process]:
        return tree_processes(self._root)

    def start(self) -> None:
        tree = self._tree()
        self._count0 = len(tree)
        self._start = {key: cpu for key, proc in tree.items() if (cpu := cpu_s(proc)) is not None}
        self._switches0 = {
            key: counts
            for key, proc in tree.items()
            if (counts := context_switches(proc.pid)) is not None
        }
        self._root0 = cpu_s(self._root) or 0.0
        self._me0 = cpu_s(self._me) or 0.0
        self._busy0 = _busy_s()
        self._t0 = time.perf_counter()

    def stop(self) -> TreeUsage:
        wall = time.perf_counter() - self._t0
        busy = _busy_s() - self._busy0
        tree = self._tree()
        tree_cpu, rss, voluntary, involuntary = 0.0, 0, 0, 0
        for key, proc in tree.items():
            cpu = cpu_s(proc)
            if cpu is None:
                continue
            tree_cpu += cpu - self._start.get(key, 0.0)
            counts = context_switches(proc.pid)
            if counts is not None:
                before = self._switches0.get(key, (0, 0))
                voluntary += counts[0] - before[0]
                involuntary += counts[1] - before[1]
            try:
                rss += proc.memory_info().rss
            except psutil.Error:
                pass
        root_cpu = (cpu_s(self._root) or self._root0) - self._root0
        harness = (cpu_s(self._me) or self._me0) - self._me0
        return TreeUsage(
            wall_s=wall,
            tree_cpu_s=tree_cpu,
            root_cpu_s=root_cpu,
            harness_cpu_s=harness,
            others_cpu_s=max(0.0, busy - tree_cpu - harness),
            processes=max(self._count0, len(tree)),
            lost=len(set(self._start) - set(tree)),
            tree_rss_bytes=rss,
            voluntary_switches=voluntary,
            involuntary_switches=involuntary,
        )
