"""A `multifs.py` mount in a subprocess, and what the drivers measure with it: the CPU of its
whole process tree, its per-process request counts, reader threads, dropping the caches.

`Mount` is a context manager: on exit (a failure or Ctrl-C too) it unmounts (fusermount3 -u,
then -u -z), SIGKILLs by PID every process of the tree it has seen, and deletes its counters
file and work dir. CPU is sum_exec_runtime of every thread (/proc/PID/task/*/schedstat, ns);
utime+stime (10 ms ticks, via psutil) is kept as a cross-check.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import psutil

from multiproc.counters import Counters, remove_counters

MULTIFS = Path(__file__).resolve().parent / "multifs.py"
READY_TIMEOUT_S = 30.0


def is_mounted(path: Path) -> bool:
    target = os.path.abspath(path)
    with open("/proc/mounts") as mounts:
        return any(line.split()[1].replace("\\040", " ") == target for line in mounts)


def drop_caches(pause_s: float = 0.3) -> None:
    """sync + drop the page, dentry and inode caches, then let the FORGETs it sends settle."""
    os.sync()
    with contextlib.suppress(OSError):
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    time.sleep(pause_s)


def run_threads(count: int, work: Callable[[int], None]) -> None:
    """`work(k)` on `count` threads; re-raises the first error."""
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            work(k)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(k,), daemon=True) for k in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


class Mount:
    """`multifs.py` with `processes` processes on a fresh mount point."""

    def __init__(self, tag: str, processes: int, files: int, extra: tuple[str, ...] = ()) -> None:
        self.tag = tag
        self.processes = processes
        self.files = files
        self.extra = extra
        self.work = Path(tempfile.mkdtemp(prefix=f"multiproc-{tag}-"))
        self.mnt = self.work / "mnt"
        self.counts_path = f"/dev/shm/multiproc-{os.getpid()}-{tag}"
        self.log_path = self.work / "multifs.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.counters: Counters | None = None
        #: every process of the tree seen so far, pid -> start time (all are killed at stop;
        #: the start time keeps a pid reused by someone else's process from being killed)
        self.known: dict[int, float] = {}

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def expected_processes(self) -> int:
        extra = list(self.extra)
        workers = 0
        if "--handoff-workers" in extra:
            workers = int(extra[extra.index("--handoff-workers") + 1])
        return self.processes + workers

    def start(self) -> Mount:
        self.mnt.mkdir()
        cmd = [sys.executable, str(MULTIFS), str(self.mnt), "--files", str(self.files)]
        cmd += ["--processes", str(self.processes), "--counts", self.counts_path, *self.extra]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self._remember([psutil.Process(self.proc.pid)])
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"multifs {self.tag} exited:\n{self.log()}")
            if is_mounted(self.mnt) and len(self.pids()) >= self.expected_processes():
                try:
                    os.stat(self.mnt / "f00000")
                    break
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"multifs {self.tag} did not come up:\n{self.log()}")
            time.sleep(0.05)
        self.counters = Counters(self.counts_path, create=False)
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"

    def pids(self) -> list[int]:
        """The tree's processes now, the root first."""
        if self.proc is None or self.proc.poll() is not None:
            return []  # a reaped root's pid may already be someone else's
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            children = []
        self._remember(children)
        return [self.proc.pid, *(p.pid for p in children)]

    def _remember(self, procs: list[psutil.Process]) -> None:
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                self.known.setdefault(proc.pid, proc.create_time())

    def _kill_known(self) -> None:
        """SIGKILL every process of the tree seen so far that is still the same process."""
        for pid, started in sorted(self.known.items()):
            try:
                if psutil.Process(pid).create_time() == started:
                    os.kill(pid, signal.SIGKILL)
            except (psutil.Error, ProcessLookupError):
                continue

    def cpu(self) -> dict[int, float]:
        """pid -> CPU seconds (sum_exec_runtime of every thread, ns resolution)."""
        out: dict[int, float] = {}
        for pid in self.pids():
            try:
                total = 0
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        total += int(f.read().split()[0])
                out[pid] = total / 1e9
            except (OSError, ValueError):
                continue
        return out

    def ticks(self) -> float:
        """utime + stime of the tree (10 ms ticks), the cross-check of `cpu()`."""
        total = 0.0
        for pid in self.pids():
            try:
                times = psutil.Process(pid).cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        return total

    def count_rows(self) -> list[dict[str, int]]:
        return self.counters.rows(self.processes) if self.counters is not None else []

    def stop(self) -> None:
        """Unmount, then SIGKILL whatever of the tree is left; remove the files it made."""
        if is_mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True, check=False)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            self.pids()
            self._kill_known()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        if is_mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True)
        if self.counters is not None:
            self.counters.close()
            self.counters = None
        remove_counters(self.counts_path)
        if not is_mounted(self.mnt):
            shutil.rmtree(self.work, ignore_errors=True)

    def __enter__(self) -> Mount:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
