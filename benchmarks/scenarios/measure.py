"""Measuring a run: CPU seconds of the processes involved, memory from /proc, a py-spy
profile, and dropping the kernel's caches before a run (so no run is served from an earlier
one's pages)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from scenarios.process_tree import cpu_s, tree_processes


def drop_kernel_caches() -> str:
    """sync + `echo 3 > /proc/sys/vm/drop_caches`; says what happened."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as exc:
        return f"not permitted ({exc.strerror or exc})"
    return "dropped"


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine has been busy since boot (all cores, kernel included)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    # cpu user nice system idle iowait irq softirq steal ...
    ticks = sum(int(fields[i]) for i in (1, 2, 3, 6, 7, 8))
    return ticks / os.sysconf("SC_CLK_TCK")


class ResourceMeter:
    """CPU seconds of named processes over an interval, and of everything else on the machine.

    A named process counts with every process under it (a mount served by several processes
    spends its CPU in all of them): the processes found at start and at stop, one that appears
    in between counted from zero, one that exits in between lost. A process under two named
    ones counts for the nearer (the harness starts Azurite and the daemon, which are named
    too)."""

    def __init__(self, pids: Mapping[str, int], prepare: Callable[[], None] | None = None) -> None:
        self._procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        #: untimed work right before every start (Bench.prepare_memory)
        self._prepare = prepare
        self._start: dict[str, dict[tuple[int, float], float]] = {}
        self._busy0 = 0.0
        self._t0 = 0.0
        #: what every start()-stop() interval measured, summed (a run with phases is metered
        #: phase by phase, never between them)
        self.usage: dict[str, float] = {}

    def _cpu(self) -> dict[str, dict[tuple[int, float], float]]:
        """Per name: CPU seconds of the process and of each under it, by (pid, start time)."""
        out = {}
        for name, proc in self._procs.items():
            if not proc.is_running():
                continue
            tree = tree_processes(proc).items()
            out[name] = {key: cpu for key, member in tree if (cpu := cpu_s(member)) is not None}
        # a process in several trees belongs to the smallest of them: its nearest named ancestor
        members = {name: set(each) for name, each in out.items()}
        for name, each in out.items():
            nearer = [keys for keys in members.values() if len(keys) < len(members[name])]
            for key in [k for k in each if any(k in keys for keys in nearer)]:
                del each[key]
        return out

    def start(self) -> None:
        if self._prepare is not None:
            self._prepare()
        self._start = self._cpu()
        self._busy0 = _busy_cpu_s()
        self._t0 = time.perf_counter()

    def stop(self) -> dict[str, float]:
        """{name: CPU seconds, "others": the rest of the machine, "wall_s": elapsed} since
        start()."""
        wall = time.perf_counter() - self._t0
        busy = _busy_cpu_s() - self._busy0
        end = self._cpu()
        out = {
            name: sum(cpu - self._start[name].get(key, 0.0) for key, cpu in end[name].items())
            for name in end
            if name in self._start
        }
        out["others"] = max(0.0, busy - sum(out.values()))
        out["wall_s"] = wall
        for key, value in out.items():
            self.usage[key] = self.usage.get(key, 0.0) + value
        return out


def proc_status_kib(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class PySpy:
    """`py-spy record` of one process, stopped by SIGINT to its PID.

    Samples only threads holding the GIL (`--gil`): where the daemon's Python CPU goes, without
    the idle waits that would otherwise fill the profile. Writes collapsed stacks ("raw" format:
    one `thread;frame;frame;... count` line per stack), which grep reads and speedscope.app or
    flamegraph.pl render.
    """

    def __init__(self, pid: int, out_file: Path) -> None:
        exe = Path(sys.executable).with_name("py-spy")
        found = str(exe) if exe.exists() else shutil.which("py-spy")
        if found is None:
            raise FileNotFoundError("py-spy not found next to the interpreter or on PATH")
        out_file.parent.mkdir(parents=True, exist_ok=True)
        self.out_file = out_file
        self._proc = subprocess.Popen(
            [
                found,
                "record",
                "-p",
                str(pid),
                "-o",
                str(out_file),
                "-f",
                "raw",
                "-r",
                "100",
                "--threads",
                "--gil",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        time.sleep(0.5)  # let it attach before the clock starts

    def stop(self) -> None:
        if self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGINT)
        try:
            self._proc.wait(60)
        except subprocess.TimeoutExpired:
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
