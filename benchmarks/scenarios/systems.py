"""The systems a scenario is run on, and how each run is measured and verified.

- `CeilingSystem`: the scenario's `CeilingPlan` done directly with `AzureStorageClient` (the
  client the mount uses) on trio, into memory, no FUSE. "ceiling" is the reference; other
  ceiling plans are diagnostics.
- `BlobmountSystem`: a fresh `blobmount mount --foreground` daemon with the scenario's
  DATASET_MOUNT_* settings and a fresh cache dir, read by reader threads in this process.
  Other mounts (`scenarios/rclone.py`) subclass `MountSystem`; `scenarios/lineup.py` says which
  systems run a scenario.

Before every run the kernel's caches are dropped (when permitted) and every mount is new, so no
run is served from an earlier one's pages or cache files.

Verification: mount readers read straight into one pre-faulted result buffer (`os.preadv`, no
copy a normal reader would not do); the ceiling keeps the bytes objects the client returned. Only
after the clock stops is every read compared with the generated source (memcmp of `bytes`, in
runs of up to 64 MiB), so checking costs the timed part nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psutil

from scenarios.base import (
    CeilingPlan,
    FileJob,
    MountPlan,
    Phase,
    Profile,
    RangeGet,
    Scenario,
    Workload,
    phase_items,
)
from scenarios.guest_memory import Prefault, prefault_free_memory

if TYPE_CHECKING:
    from scenarios.datasets import Datasets, Store

log = logging.getLogger(__name__)

MOUNT_READY_TIMEOUT_S = 60.0
UNMOUNT_WAIT_S = 30.0
#: the settings and credentials a mount must not inherit from the caller's environment
FOREIGN_ENV = ("DATASET_", "AZURE_STORAGE", "AZUREML_", "RSLEX_")


# -- the run's shared state --------------------------------------------------------------------


@dataclass
class Bench:
    """What every system needs: the datasets, where to put files, options."""

    datasets: Datasets
    profile: Profile
    out_dir: Path
    repeat: int = 1
    py_spy: bool = False
    #: a fixed limit per run instead of `timeout_for(workload, bench)`
    run_timeout_s: float | None = None
    #: write once to the memory a run will take, just before it (guest_memory.py)
    prefault: bool = True
    #: "dropped", or why the kernel caches could not be dropped (filled in by the first run)
    cache_drop: str = ""
    #: the next run's prefault: bytes to write, and what was done (see prepare_memory)
    prefault_bytes: int = 0
    last_prefault: Prefault | None = None

    def arm_prefault(self, nbytes: int) -> None:
        """The next run writes once to `nbytes` of free memory just before its timer starts."""
        self.prefault_bytes = nbytes if self.prefault else 0
        self.last_prefault = None

    def prepare_memory(self) -> None:
        """Called by the meter right before a run's timed part (once per run): after the
        mount is up, so that the memory is still backed by the host when the run takes it."""
        if self.prefault_bytes and self.last_prefault is None:
            self.last_prefault = prefault_free_memory(self.prefault_bytes)


# -- measuring ---------------------------------------------------------------------------------


#: a mount system that keeps the kernel's caches between phases is named with this suffix
KEPT_SUFFIX = "-kept"
KEPT_NOTE = "; kernel caches dropped before the run only, kept from phase to phase"


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
    """CPU seconds of named processes over an interval, and of everything else on the machine."""

    def __init__(self, pids: Mapping[str, int], prepare: Callable[[], None] | None = None) -> None:
        self._procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        #: untimed work right before every start (Bench.prepare_memory)
        self._prepare = prepare
        self._start: dict[str, float] = {}
        self._busy0 = 0.0
        self._t0 = 0.0
        #: what every start()-stop() interval measured, summed (a run with phases is metered
        #: phase by phase, never between them)
        self.usage: dict[str, float] = {}

    def _cpu(self) -> dict[str, float]:
        out = {}
        for name, proc in self._procs.items():
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            out[name] = times.user + times.system
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
        out = {name: end[name] - self._start[name] for name in end if name in self._start}
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


# -- the result buffer and verification --------------------------------------------------------


def new_buffer(size: int) -> bytearray:
    """A zeroed result buffer with every page already faulted in (outside the timed part: on
    this VM first-touch page faults cost about 1 s per GiB). Zeroed, so a read that never
    happened cannot pass verification."""
    return bytearray(1) * size


#: contiguous reads are compared in runs of up to this many bytes
_VERIFY_RUN = 64 * 1024 * 1024


def _same(got: memoryview | bytes, source: bytes, offset: int) -> bool:
    # bytes == bytes is one memcmp; memoryview == memoryview compares item by item (~100x slower)
    want = source[offset : offset + len(got)]
    return (got if isinstance(got, bytes) else bytes(got)) == want


def verify_mount_reads(
    plan: MountPlan, buf: bytearray, source: Callable[[str], bytes]
) -> str | None:
    """None if every read of the plan put the right bytes at its dest, else where it did not."""
    view = memoryview(buf)
    for job in plan.jobs:
        content = source(job.blob)
        run_off = run_dest = run_len = 0
        for r in (*job.reads, None):
            # merge reads that are contiguous both in the file and in the buffer
            if (
                r is not None
                and run_len
                and r.offset == run_off + run_len
                and r.dest == run_dest + run_len
                and run_len < _VERIFY_RUN
            ):
                run_len += r.length
                continue
            if run_len and not _same(view[run_dest : run_dest + run_len], content, run_off):
                return f"{job.blob}, somewhere in bytes {run_off}-{run_off + run_len - 1}"
            if r is not None:
                run_off, run_dest, run_len = r.offset, r.dest, r.length
    return None


def verify_gets(pieces: list[tuple[RangeGet, bytes]], source: Callable[[str], bytes]) -> str | None:
    """None if every GET returned exactly the bytes of its range, else the first that did not."""
    for get, data in pieces:
        if len(data) != get.length or not _same(data, source(get.blob), get.offset):
            return f"{get.blob}, GET of bytes {get.offset}-{get.offset + get.length - 1}"
    return None


# -- results -----------------------------------------------------------------------------------


@dataclass
class RunMetrics:
    """One timed run of one system."""

    seconds: float
    verified: bool
    #: CPU seconds of the process that moved the data: the daemon, or (ceiling) this process
    client_cpu_s: float | None = None
    harness_cpu_s: float | None = None
    azurite_cpu_s: float | None = None
    #: the delay proxy's, when the scenario has one (scenarios/delay_proxy.py)
    proxy_cpu_s: float | None = None
    others_cpu_s: float | None = None
    peak_rss_bytes: int | None = None
    rss_after_mount_bytes: int | None = None
    mount_s: float | None = None
    #: storage requests during the timed part (from `blobmount stats --json`, or counted)
    storage: dict[str, int] = field(default_factory=dict)
    stats_after: dict[str, Any] | None = None
    profile_file: str | None = None
    #: where the first wrong byte was (blob and range), for a run that failed verification
    mismatch_at: str | None = None
    #: a listing's milestones: label ("first", "50,000th") -> seconds from the start
    listing: dict[str, float] = field(default_factory=dict)
    #: a plan with phases: seconds of each phase, and (for a mount with counters) its requests
    phases: dict[str, float] = field(default_factory=dict)
    phase_storage: dict[str, dict[str, int]] = field(default_factory=dict)
    #: free memory written once and freed just before the run (guest_memory.py), untimed
    prefault_bytes: int = 0
    prefault_s: float = 0.0


@dataclass
class PhasedRun:
    """What the timed part of one run measured, phase by phase."""

    #: the run's time: the phases in the total
    seconds: float = 0.0
    #: each phase's seconds, kept only for a plan with phases
    phases: dict[str, float] = field(default_factory=dict)
    phase_storage: dict[str, dict[str, int]] = field(default_factory=dict)
    #: the daemon's counters after the last phase
    stats_after: dict[str, Any] | None = None
    #: the first listing phase that did not find exactly the dataset's files
    listing_mismatch: str | None = None

    def add(self, phase: Phase, seconds: float, keep: bool) -> None:
        if phase.in_total:
            self.seconds += seconds
        if keep:
            self.phases[phase.name] = seconds


@dataclass
class SystemResult:
    """A system in a scenario: its runs (or the error that stopped it)."""

    scenario: str
    system: str
    kind: str  # "ceiling", "diagnostic" or "mount"
    description: str
    requested_bytes: int
    files: int
    settings: dict[str, str] = field(default_factory=dict)
    runs: list[RunMetrics] = field(default_factory=list)
    error: str | None = None
    cache_drop: str = ""

    @property
    def median(self) -> RunMetrics | None:
        """The run with the median time (the slower middle one for an even count)."""
        if not self.runs:
            return None
        ordered = sorted(self.runs, key=lambda r: r.seconds)
        return ordered[len(ordered) // 2]

    @property
    def seconds(self) -> float | None:
        return statistics.median(r.seconds for r in self.runs) if self.runs else None

    @property
    def verified(self) -> bool:
        return bool(self.runs) and all(r.verified for r in self.runs)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["seconds_median"] = self.seconds
        out["verified"] = self.verified
        return out


# -- systems -----------------------------------------------------------------------------------


class System(ABC):
    """Something a scenario's workload can be run on."""

    name: str
    kind: str
    description: str

    def applies_to(self, workload: Workload) -> bool:
        return True

    @abstractmethod
    def run_once(self, bench: Bench, scenario: Scenario, workload: Workload) -> RunMetrics:
        """One timed, verified run."""

    def settings(self, scenario: Scenario) -> dict[str, str]:
        return {}

    def describe(self, workload: Workload) -> str:
        return self.description


def timeout_for(workload: Workload, bench: Bench) -> float:
    """A generous bound on one run: a stalled mount must not stall the whole benchmark."""
    if bench.run_timeout_s is not None:
        return bench.run_timeout_s
    return max(120.0, workload.requested_bytes / 10e6 + workload.files / 25)


class CeilingSystem(System):
    """A ceiling plan done directly with AzureStorageClient, as fast as the backend allows."""

    kind = "ceiling"

    def __init__(self, plan_name: str) -> None:
        self.name = plan_name
        self.kind = "ceiling" if plan_name == "ceiling" else "diagnostic"
        self.description = ""

    def applies_to(self, workload: Workload) -> bool:
        return self.name in workload.ceilings

    def describe(self, workload: Workload) -> str:
        return workload.ceilings[self.name].description

    def run_once(self, bench: Bench, scenario: Scenario, workload: Workload) -> RunMetrics:
        plan = workload.ceilings[self.name]
        store = workload.store
        meter = ResourceMeter(
            {"harness": os.getpid(), **store.backend_pids()}, bench.prepare_memory
        )
        timed, pieces = run_ceiling_plan(store, plan, meter, timeout_for(workload, bench))
        usage = meter.usage
        mismatch = timed.listing_mismatch or verify_gets(pieces, workload.source)
        del pieces
        gets = sum(len(step) for step in plan.steps)
        return RunMetrics(
            seconds=timed.seconds,
            verified=mismatch is None,
            client_cpu_s=usage.get("harness"),
            harness_cpu_s=usage.get("harness"),
            azurite_cpu_s=usage.get("azurite"),
            proxy_cpu_s=usage.get("proxy"),
            others_cpu_s=usage.get("others"),
            storage={"range_requests": gets, "range_bytes": workload.requested_bytes},
            mismatch_at=mismatch,
            phases=timed.phases,
        )


def run_ceiling_plan(
    store: Store,
    plan: CeilingPlan,
    meter: ResourceMeter,
    timeout_s: float,
) -> tuple[PhasedRun, list[tuple[RangeGet, bytes]]]:
    """Run `plan` on trio, phase by phase on one client; returns the times and
    [(GET, bytes it returned)].

    The client is created and one request made before the clock starts, as the mount does
    before it is ready (the SDK client and one connection exist; the rest open during the run).
    """
    import trio

    from blobmount.storage.azure import AzureStorageClient

    got: list[tuple[RangeGet, bytes]] = []
    run = PhasedRun()

    async def drain(client: AzureStorageClient, gets: Iterator[RangeGet]) -> None:
        # workers share the iterator: each takes the next GET when its last one is done
        got.extend([(g, await client.get_range(g.blob, g.etag, g.offset, g.length)) for g in gets])

    async def list_all(client: AzureStorageClient) -> set[str]:
        names: set[str] = set()
        token: str | None = None
        while True:
            page = await client.list_page("", delimiter=None, continuation=token)
            names.update(blob.name for blob in page.blobs)
            if (token := page.continuation) is None:
                return names

    async def run_steps(client: AzureStorageClient, steps: Sequence[tuple[RangeGet, ...]]) -> None:
        for step in steps:
            gets = iter(step)
            if len(step) == 1:
                await drain(client, gets)
                continue
            async with trio.open_nursery() as nursery:
                for _ in range(min(plan.concurrency, len(step))):
                    nursery.start_soon(drain, client, gets)

    async def main() -> None:
        # max_connections as the daemon sets it: max(64, 2 * READ_THREADS)
        client = AzureStorageClient(
            store.account_url, store.container, store.az.credential(), max_connections=64
        )
        try:
            await client.get_properties(plan.steps[0][0].blob)
            with trio.fail_after(timeout_s):
                for i, (phase, steps) in enumerate(phase_items(plan.phases, plan.steps)):
                    if i:
                        drop_kernel_caches()  # as between a mount's phases
                    if phase.in_total:
                        meter.start()
                    started = time.perf_counter()
                    if phase.listing is None:
                        await run_steps(client, steps)
                    else:
                        found = await list_all(client)
                        run.listing_mismatch = run.listing_mismatch or listing_mismatch(
                            phase.name, found, phase.listing
                        )
                    run.add(phase, time.perf_counter() - started, bool(plan.phases))
                    if phase.in_total:
                        meter.stop()
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()

    trio.run(main)
    return run, got


# -- mounts ------------------------------------------------------------------------------------


def is_mounted(path: Path) -> bool:
    target = os.path.abspath(path)
    try:
        with open("/proc/mounts") as mounts:
            return any(line.split()[1].replace("\\040", " ") == target for line in mounts)
    except OSError:
        return False


def fusermount_unmount(path: Path) -> bool:
    """`fusermount3 -u`, then `-u -z` (lazy) if that fails; True once it is not mounted."""
    for args in (["-u"], ["-u", "-z"]):
        if not is_mounted(path):
            return True
        subprocess.run(["fusermount3", *args, str(path)], capture_output=True, check=False)
    return not is_mounted(path)


class MountedDaemon:
    """A FUSE daemon in a subprocess (own session: a terminal's ^C reaches only the harness)
    on a fresh mount point, cache dir and runtime dir. Always unmounted and stopped on exit."""

    def __init__(self, cmd: list[str], env: dict[str, str], work: Path) -> None:
        self.cmd = cmd
        self.env = env
        self.work = work
        #: what shows the mount answers (a listing benchmark must not list the root before
        #: the clock starts, and sets os.stat)
        self.ready_check: Callable[[Path], object] = os.listdir
        self.mountpoint = work / "mnt"
        self.log_file = work / "daemon.log"
        #: where the daemon's log is kept after the work dir is removed
        self.log_copy: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.mount_s: float | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("daemon not started")
        return self.proc.pid

    def log_tail(self, limit: int = 3000) -> str:
        """The end of the daemon's log, or of its stderr when the log is empty."""
        for path in (self.log_file, self.work / "daemon.stderr"):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            if text.strip():
                return text[-limit:]
        return "(no log)"

    def start(self) -> MountedDaemon:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        # the daemon logs to log_file itself (and to stderr in the foreground): keep its
        # stdout/stderr apart, for what happens before logging starts
        with open(self.work / "daemon.stderr", "ab") as out:
            self.proc = subprocess.Popen(
                self.cmd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + MOUNT_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the daemon exited with status {self.proc.returncode} before the mount "
                    f"was ready:\n{self.log_tail()}"
                )
            if is_mounted(self.mountpoint):
                try:
                    self.ready_check(self.mountpoint)
                except OSError:
                    pass
                else:
                    self.mount_s = time.perf_counter() - started
                    return self
            time.sleep(0.05)
        raise RuntimeError(
            f"mount not ready after {MOUNT_READY_TIMEOUT_S:.0f}s:\n{self.log_tail()}"
        )

    def abort(self) -> None:
        """Kill the daemon now, then lazy-unmount (a stalled or interrupted run).

        The kill comes first: while a reader holds a file of a daemon that does not answer,
        starting any subprocess (fusermount3 included) hangs, because the child's exec closes
        the inherited FUSE descriptors and each close waits for the daemon's FLUSH reply. A dead
        daemon aborts the FUSE connection, so every waiting request fails at once.
        """
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        subprocess.run(
            ["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True, check=False
        )

    def stop(self) -> None:
        """fusermount3 -u, then -u -z; wait for the daemon; SIGTERM, then SIGKILL, by PID."""
        unmounted = fusermount_unmount(self.mountpoint)
        proc = self.proc
        if proc is not None:
            try:
                proc.wait(UNMOUNT_WAIT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
        if self.log_copy is not None:
            with contextlib.suppress(OSError):
                self.log_copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.log_file, self.log_copy)
        if unmounted or fusermount_unmount(self.mountpoint):
            shutil.rmtree(self.work, ignore_errors=True)
        else:
            log.error("%s is still mounted; left %s in place", self.mountpoint, self.work)

    def __enter__(self) -> MountedDaemon:
        try:
            return self.start()
        except BaseException:
            self.abort()
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self.abort()
        self.stop()


def _in_threads(
    name: str, threads: int, work: Callable[[threading.Event], None], timeout_s: float
) -> None:
    """Run `work(stop)` on `threads` threads; the first error sets `stop` for the others.

    Raises the first error, or TimeoutError (the caller then aborts the mount, which unblocks
    the threads).
    """
    errors: list[BaseException] = []
    stop = threading.Event()

    def guarded() -> None:
        try:
            work(stop)
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    pool = [
        threading.Thread(target=guarded, name=f"{name}-{i}", daemon=True) for i in range(threads)
    ]
    for thread in pool:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in pool:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            stop.set()
            raise TimeoutError(f"{name} threads still busy after {timeout_s:.0f}s")
    if errors:
        raise errors[0]


@dataclass(frozen=True, slots=True)
class HintSource:
    """Read-order hints for a mount run: how far ahead, and the daemon's environment (which
    says where its hint socket is)."""

    window: int
    environ: Mapping[str, str]

    def wrap(self, jobs: Iterator[FileJob], path_of: Callable[[FileJob], str]) -> Iterator[FileJob]:
        from blobmount.hints.client import hinted

        return hinted(jobs, window=self.window, path_of=path_of, environ=self.environ)


def read_through_mount(
    root: Path,
    jobs: Sequence[FileJob],
    threads: int,
    buf: bytearray,
    timeout_s: float,
    hints: HintSource | None = None,
) -> None:
    """Run `jobs` on `threads` reader threads; every read goes into `buf` at its dest. With
    `hints`, the jobs' paths are hinted to the mount a window ahead of the readers, in the order
    the readers take them (what `blobmount.hints.client.HintedSampler` does for a data loader)."""
    view = memoryview(buf)
    base = str(root)
    source: Iterator[FileJob] = iter(jobs)
    if hints is not None:
        source = hints.wrap(source, lambda job: f"{base}/{job.blob}")
    taking = threading.Lock()

    def reader(stop: threading.Event) -> None:
        while not stop.is_set():
            with taking:
                job = next(source, None)
            if job is None:
                return
            fd = os.open(f"{base}/{job.blob}", os.O_RDONLY)
            try:
                for r in job.reads:
                    done = 0
                    while done < r.length:
                        n = os.preadv(
                            fd, [view[r.dest + done : r.dest + r.length]], r.offset + done
                        )
                        if n <= 0:
                            raise OSError(f"{job.blob}: read ended at {r.offset + done}")
                        done += n
            finally:
                os.close(fd)

    _in_threads("reader", threads, reader, timeout_s)


def walk_mount(root: Path, timeout_s: float) -> set[str]:
    """Every file under `root` (os.walk: a scandir of each folder, no stat of files), as paths
    relative to it: what a data loader indexing its dataset does."""
    found: set[str] = set()

    def walk(stop: threading.Event) -> None:
        for folder, _, files in os.walk(root):
            rel = os.path.relpath(folder, root)
            found.update(name if rel == "." else f"{rel}/{name}" for name in files)

    _in_threads("walker", 1, walk, timeout_s)
    return found


def listing_mismatch(name: str, found: set[str], want: frozenset[str]) -> str | None:
    """None if a listing found exactly the expected files, else what differed."""
    missing, extra = sorted(want - found), sorted(found - want)
    if not missing and not extra:
        return None
    return (
        f"{name}: {len(missing)} file(s) missing {missing[:3]}, {len(extra)} unexpected {extra[:3]}"
    )


class MountSystem(System):
    """A FUSE mount read by reader threads. Subclasses say how to start the daemon."""

    kind = "mount"
    #: True: the kernel's caches are dropped before the run only, not between its phases
    keeps_kernel_caches = False

    @abstractmethod
    def daemon(self, store: Store, scenario: Scenario, work: Path) -> MountedDaemon:
        """A not yet started daemon that mounts the store's container at work/"mnt"."""

    def stats(self, daemon: MountedDaemon) -> dict[str, Any] | None:
        """The daemon's counters, or None if it has none."""
        return None

    def hints(self, daemon: MountedDaemon) -> HintSource | None:
        """Read-order hints the readers send this mount (None: none)."""
        return None

    def describe(self, workload: Workload) -> str:
        return f"{self.description}; {workload.mount.description}"

    def run_once(self, bench: Bench, scenario: Scenario, workload: Workload) -> RunMetrics:
        buf = new_buffer(workload.requested_bytes)
        work = Path(tempfile.mkdtemp(prefix="bmbench-"))
        run_no = len(list(bench.out_dir.glob(f"logs/{scenario.name}-{self.name}-*.log")))
        daemon = self.daemon(workload.store, scenario, work)
        daemon.log_copy = bench.out_dir / "logs" / f"{scenario.name}-{self.name}-{run_no}.log"
        spy: PySpy | None = None
        with daemon:
            before = self.stats(daemon)
            rss_mounted = proc_status_kib(daemon.pid, "VmRSS")
            meter = ResourceMeter(
                {"harness": os.getpid(), **workload.store.backend_pids(), "daemon": daemon.pid},
                bench.prepare_memory,
            )
            if bench.py_spy:
                flame = bench.out_dir / "profiles" / f"{scenario.name}-{self.name}-{run_no}.txt"
                spy = PySpy(daemon.pid, flame)
            try:
                timed = self._run_phases(
                    daemon, workload.mount, buf, meter, before, timeout_for(workload, bench)
                )
            finally:
                if spy is not None:
                    spy.stop()
            after = timed.stats_after if workload.mount.phases else self.stats(daemon)
            hwm = proc_status_kib(daemon.pid, "VmHWM")
        mismatch = timed.listing_mismatch or verify_mount_reads(
            workload.mount, buf, workload.source
        )
        del buf
        usage = meter.usage
        return RunMetrics(
            seconds=timed.seconds,
            verified=mismatch is None,
            client_cpu_s=usage.get("daemon"),
            harness_cpu_s=usage.get("harness"),
            azurite_cpu_s=usage.get("azurite"),
            proxy_cpu_s=usage.get("proxy"),
            others_cpu_s=usage.get("others"),
            peak_rss_bytes=None if hwm is None else hwm * 1024,
            rss_after_mount_bytes=None if rss_mounted is None else rss_mounted * 1024,
            mount_s=daemon.mount_s,
            storage=_storage_delta(before, after),
            stats_after=after,
            profile_file=None if spy is None else str(spy.out_file),
            mismatch_at=mismatch,
            phases=timed.phases,
            phase_storage=timed.phase_storage,
        )

    def _run_phases(
        self,
        daemon: MountedDaemon,
        plan: MountPlan,
        buf: bytearray,
        meter: ResourceMeter,
        stats_before: dict[str, Any] | None,
        timeout_s: float,
    ) -> PhasedRun:
        """The plan's phases in order on one mount; only phases in the total are metered.

        Between phases: the kernel's caches are dropped (unless this system keeps them) and
        (for a plan with phases) the daemon's counters read, both untimed.
        """
        run = PhasedRun()
        deadline = time.monotonic() + timeout_s
        last_stats = stats_before
        for i, (phase, jobs) in enumerate(phase_items(plan.phases, plan.jobs)):
            if i and not self.keeps_kernel_caches:
                drop_kernel_caches()
            if phase.in_total:
                meter.start()
            started = time.perf_counter()
            try:
                if phase.listing is None:
                    read_through_mount(
                        daemon.mountpoint,
                        jobs,
                        plan.threads,
                        buf,
                        deadline - time.monotonic(),
                        self.hints(daemon),
                    )
                else:
                    found = walk_mount(daemon.mountpoint, deadline - time.monotonic())
                    run.listing_mismatch = run.listing_mismatch or listing_mismatch(
                        phase.name, found, phase.listing
                    )
            except Exception as exc:
                where = f"{phase.name}: " if plan.phases else ""
                raise RuntimeError(
                    f"{where}{exc}\n--- daemon log ---\n{daemon.log_tail()}"
                ) from exc
            run.add(phase, time.perf_counter() - started, bool(plan.phases))
            if phase.in_total:
                meter.stop()
            if plan.phases:
                now = self.stats(daemon)
                run.phase_storage[phase.name] = _storage_delta(last_stats, now)
                last_stats = run.stats_after = now
        return run


def _storage_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, int]:
    if not before or not after:
        return {}
    b, a = before.get("storage", {}), after.get("storage", {})
    return {
        key: a[key] - b.get(key, 0)
        for key in ("range_requests", "range_bytes", "properties_requests", "list_requests")
        if isinstance(a.get(key), int)
    }


class BlobmountSystem(MountSystem):
    """`blobmount mount --foreground`, fresh, with the scenario's seed-recommended settings
    (and, for a diagnostic variant, `extra_env` on top)."""

    def __init__(
        self,
        name: str = "blobmount",
        extra_env: Mapping[str, str] | None = None,
        hint_window: int = 0,
        keep_kernel_caches: bool = False,
    ) -> None:
        self.name = f"{name}{KEPT_SUFFIX}" if keep_kernel_caches else name
        self.keeps_kernel_caches = keep_kernel_caches
        self.extra_env = dict(extra_env or {})
        self.hint_window = hint_window
        self.kind = "diagnostic" if extra_env else "mount"
        self.description = "blobmount mount (block mode), fresh daemon and cache dir"
        if extra_env:
            changed = " ".join(f"{k}={v}" for k, v in self.extra_env.items())
            self.description = f"diagnostic: {self.description}, with {changed}"
        if keep_kernel_caches:
            self.description += KEPT_NOTE
        if hint_window:
            self.description += (
                f"; the readers' order hinted {hint_window} files ahead "
                "(blobmount.hints.client.hinted)"
            )

    def hints(self, daemon: MountedDaemon) -> HintSource | None:
        return HintSource(self.hint_window, daemon.env) if self.hint_window else None

    def settings(self, scenario: Scenario) -> dict[str, str]:
        return {**scenario.mount_env, **self.extra_env}

    def _env(self, store: Store, scenario: Scenario, work: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN_ENV)}
        env.update(self.settings(scenario))
        env["AZURE_STORAGE_CONNECTION_STRING"] = store.connection_string
        env["DATASET_MOUNT_CACHE_DIR"] = str(work / "cache")
        # a private runtime dir: the stats socket and mount record of this daemon only
        env["XDG_RUNTIME_DIR"] = str(work / "run")
        env["XDG_STATE_HOME"] = str(work / "state")
        return env

    def daemon(self, store: Store, scenario: Scenario, work: Path) -> MountedDaemon:
        uri = store.uri
        cmd = [
            sys.executable,
            "-m",
            "blobmount",
            "mount",
            "--foreground",
            "--log-file",
            str(work / "daemon.log"),
            uri,
            str(work / "mnt"),
        ]
        return MountedDaemon(cmd, self._env(store, scenario, work), work)

    def stats(self, daemon: MountedDaemon) -> dict[str, Any] | None:
        done = subprocess.run(
            [sys.executable, "-m", "blobmount", "stats", str(daemon.mountpoint), "--json"],
            env=daemon.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            log.warning("blobmount stats failed: %s", done.stderr.strip())
            return None
        stats: dict[str, Any] = json.loads(done.stdout)
        return stats
