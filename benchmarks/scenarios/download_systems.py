"""The systems of the download scenarios: `blobmount download` itself, and its local side alone.

- `DownloadSystem`: `python -m blobmount download <container> <fresh dir> --json` in a
  subprocess, with extra options for a variant. Its time is the command's own `elapsed_s`
  (from the listing to the final syncfs + manifest: the data is on disk when it ends), as a
  mount's time leaves its start-up out; interpreter start, credentials and exit are reported
  apart. CPU seconds are the child's own over that part, peak RSS its own, requests its
  `requests`.
- `LocalDownloadSystem` (diagnostic): the same `Downloader` in this process from an
  `InMemoryStorageClient` holding the same bytes: temp files, pwrite, rename, syncfs and
  manifest with no network. On a 2-core machine where Azurite shares the cores, download is
  about ceiling + this, because the two sides cannot overlap for want of cores.

A download is verified after the clock stops: every file is read back from the folder into a
result buffer and compared with the source (as a mount's reads are), and the folder must hold
exactly the dataset's files besides the download's own manifest.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from scenarios.base import FOREIGN_ENV, Bench, Scenario, System, Workload, timeout_for
from scenarios.measure import ResourceMeter, proc_status_kib
from scenarios.readers import read_through_mount, walk_mount
from scenarios.results import RunMetrics
from scenarios.verify import listing_mismatch, new_buffer, verify_mount_reads

log = logging.getLogger(__name__)

#: RSLEX_DOWNLOADER_THREADS' default (4 x cores), given explicitly so the ceiling matches it
TRANSFERS = min(4 * (os.cpu_count() or 1), 1024)
#: the download's own entries at the top of DEST (manifest, its journal, the temp folder)
OWN_ENTRIES = ".blobmount-download"
#: how often a running download's memory is sampled
POLL_S = 0.02


def verify_download(dest: Path, workload: Workload, timeout_s: float) -> str | None:
    """None if `dest` holds exactly the dataset's files with the right bytes, else what is
    wrong. Reads them back as the workload's readers would."""
    found = {name for name in walk_mount(dest, timeout_s) if not name.startswith(OWN_ENTRIES)}
    plan = workload.mount
    wrong = listing_mismatch("download", found, frozenset(job.blob for job in plan.jobs))
    if wrong:
        return wrong
    buf = new_buffer(workload.requested_bytes)
    read_through_mount(dest, plan.jobs, plan.threads, buf, timeout_s)
    return verify_mount_reads(plan, buf, workload.source)


@dataclass(frozen=True, slots=True)
class ChildRun:
    status: int
    #: CPU seconds of its whole life
    cpu_s: float
    #: the child's VmHWM, sampled every POLL_S while it ran
    peak_rss_bytes: int
    #: (perf_counter, CPU seconds so far), sampled every POLL_S
    cpu_samples: tuple[tuple[float, float], ...]
    ended: float

    def cpu_since(self, moment: float) -> float:
        """CPU seconds it used after `moment` (perf_counter), to within one sample."""
        before = [cpu for t, cpu in self.cpu_samples if t <= moment]
        return self.cpu_s - (before[-1] if before else 0.0)


def _run_child(cmd: list[str], env: dict[str, str], work: Path, timeout_s: float) -> ChildRun:
    """Run `cmd` to its end (own session, stdout to work/"stdout"). Killed by PID on timeout or
    interruption.

    CPU comes from `wait4` (psutil cannot read an exited process), but not the peak RSS: Linux
    carries the pre-exec high-water mark into ru_maxrss, and before exec the child was a copy
    of this process with the datasets in it. VmHWM of the exec'd program is sampled instead.
    """
    with open(work / "stdout", "wb") as out, open(work / "stderr", "wb") as err:
        proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
        )
    peak_kib = 0
    samples: list[tuple[float, float]] = []
    try:
        watch = psutil.Process(proc.pid)
        deadline = time.monotonic() + timeout_s
        while True:
            # Popen returns once the exec happened, so this is the download's own memory
            peak_kib = max(peak_kib, proc_status_kib(proc.pid, "VmHWM") or 0)
            with contextlib.suppress(psutil.Error):
                times = watch.cpu_times()
                samples.append((time.perf_counter(), times.user + times.system))
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"download still running after {timeout_s:.0f}s")
            time.sleep(POLL_S)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.wait4(proc.pid, 0)
        proc.returncode = -signal.SIGKILL
        raise
    ended = time.perf_counter()
    # reaped here, so Popen must never wait for it again
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu_s = usage.ru_utime + usage.ru_stime
    return ChildRun(proc.returncode, cpu_s, peak_kib * 1024, tuple(samples), ended)


class DownloadSystem(System):
    """`blobmount download` of the store's container into a fresh folder."""

    kind = "download"

    def __init__(
        self, name: str, extra_args: tuple[str, ...] = (), diagnostic: str | None = None
    ) -> None:
        self.name = name
        self.extra_args = extra_args
        command = " ".join(("blobmount download --threads", str(TRANSFERS), *extra_args))
        self.description = (
            f"`{command}` into a fresh folder, in a subprocess; time = its own elapsed_s "
            "(listing to data on disk)"
        )
        if diagnostic:
            self.kind = "diagnostic"
            self.description = f"diagnostic ({diagnostic}): {self.description}"

    def settings(self, scenario: Scenario) -> dict[str, str]:
        return {"--threads": str(TRANSFERS), **dict.fromkeys(self.extra_args, "")}

    def run_once(self, bench: Bench, scenario: Scenario, workload: Workload) -> RunMetrics:
        store = workload.store
        work = Path(tempfile.mkdtemp(prefix="bmbench-"))
        try:
            dest = work / "dest"
            env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN_ENV)}
            env["AZURE_STORAGE_CONNECTION_STRING"] = store.connection_string
            cmd = [
                sys.executable,
                "-m",
                "blobmount",
                "download",
                store.uri,
                str(dest),
                "--json",
                "--no-progress",
                "--threads",
                str(TRANSFERS),
                *self.extra_args,
            ]
            meter = ResourceMeter(
                {"harness": os.getpid(), "azurite": store.az.pid}, bench.prepare_memory
            )
            meter.start()
            started = time.perf_counter()
            child = _run_child(cmd, env, work, timeout_for(workload, bench))
            wall = time.perf_counter() - started
            usage = meter.stop()
            stderr = (work / "stderr").read_text(errors="replace")[-3000:]
            if child.status != 0:
                raise RuntimeError(f"blobmount download exited with {child.status}:\n{stderr}")
            summary: dict[str, Any] = json.loads((work / "stdout").read_text())
            mismatch = verify_download(dest, workload, timeout_for(workload, bench))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        seconds = float(summary["stats"]["elapsed_s"])
        # the timed part is the end of the child's life (its exit takes a few ms): leave its
        # start-up out of its CPU, and count the machine's other work over that part only
        client_cpu = child.cpu_since(child.ended - seconds)
        others = max(0.0, usage.get("others", 0.0) - child.cpu_s) * seconds / (wall or 1.0)
        return RunMetrics(
            seconds=seconds,
            verified=mismatch is None,
            client_cpu_s=client_cpu,
            harness_cpu_s=usage.get("harness"),
            azurite_cpu_s=usage.get("azurite"),
            others_cpu_s=others,
            peak_rss_bytes=child.peak_rss_bytes,
            mount_s=wall - seconds,
            storage={k: v for k, v in summary["requests"].items() if isinstance(v, int)},
            stats_after=summary,
            mismatch_at=mismatch,
        )


class LocalDownloadSystem(System):
    """Diagnostic: the download's local side alone (an in-memory store, no network)."""

    name = "download-local"
    kind = "diagnostic"
    description = (
        "diagnostic: the same Downloader in the harness process from an InMemoryStorageClient "
        f"holding the same bytes, {TRANSFERS} transfers (no network: temp files, pwrite, rename, "
        "syncfs, manifest)"
    )

    def run_once(self, bench: Bench, scenario: Scenario, workload: Workload) -> RunMetrics:
        import trio

        from blobmount.download_mode.downloader import DownloadConfig, Downloader
        from blobmount.storage.memory import InMemoryStorageClient

        memory = InMemoryStorageClient()
        for blob in {job.blob for job in workload.mount.jobs}:
            memory.put(blob, workload.source(blob), md5=False)
        work = Path(tempfile.mkdtemp(prefix="bmbench-"))
        try:
            dest = work / "dest"
            downloader = Downloader(memory, DownloadConfig(dest=dest, transfers=TRANSFERS))
            meter = ResourceMeter(
                {"harness": os.getpid(), "azurite": workload.store.az.pid}, bench.prepare_memory
            )
            meter.start()
            result = trio.run(downloader.run)
            usage = meter.stop()
            if not result.ok:
                raise RuntimeError(f"download failed: {result.fatal or result.failures[:3]}")
            mismatch = verify_download(dest, workload, timeout_for(workload, bench))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return RunMetrics(
            seconds=result.stats.elapsed_s,
            verified=mismatch is None,
            client_cpu_s=usage.get("harness"),
            harness_cpu_s=usage.get("harness"),
            azurite_cpu_s=usage.get("azurite"),
            others_cpu_s=usage.get("others"),
            mismatch_at=mismatch,
        )
