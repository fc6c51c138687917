"""A FUSE mount as a system: a fresh daemon per run, read by reader threads in this process.

Subclasses say how to start the daemon (`BlobmountSystem`, `RcloneSystem`), and how to read its
counters. Before every run the kernel's caches are dropped (when permitted) and every mount is
new, so no run is served from an earlier one's pages or cache files. The run is verified read
by read after the clock stops (scenarios/verify.py).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from abc import abstractmethod
from pathlib import Path
from typing import Any

from scenarios.base import Bench, Scenario, System, Workload, timeout_for
from scenarios.datasets import Store
from scenarios.measure import PySpy, ResourceMeter, drop_kernel_caches, proc_status_kib
from scenarios.mounted import MountedDaemon
from scenarios.plans import MountPlan, phase_items
from scenarios.readers import HintSource, read_through_mount, walk_mount
from scenarios.results import PhasedRun, RunMetrics, storage_delta
from scenarios.serial_part import process_deltas, serial_part
from scenarios.verify import listing_mismatch, new_buffer, verify_mount_reads


class MountSystem(System):
    """A FUSE mount read by reader threads. Subclasses say how to start the daemon."""

    kind = "mount"
    #: True: the kernel's caches are dropped before the run only, not between its phases
    keeps_kernel_caches = False
    #: read the scenario's mount plan with this many reader threads instead of its own number
    #: (None: its own); a DataLoader worker reads with one
    readers: int | None = None

    @abstractmethod
    def daemon(self, store: Store, scenario: Scenario, work: Path) -> MountedDaemon:
        """A not yet started daemon that mounts the store's container at work/"mnt"."""

    def stats(self, daemon: MountedDaemon) -> dict[str, Any] | None:
        """The daemon's counters, or None if it has none."""
        return None

    def hints(self, daemon: MountedDaemon) -> HintSource | None:
        """Read-order hints the readers send this mount (None: none)."""
        return None

    def _own_readers(self, workload: Workload) -> Workload:
        """The workload, its mount plan read by `readers` threads when this system has its own
        number."""
        plan = workload.mount
        if not self.readers or self.readers == plan.threads:
            return workload
        was = f"{plan.threads} threads"
        now = f"{self.readers} thread{'s' if self.readers > 1 else ''}"
        description = plan.description.replace(was, now, 1)
        if description == plan.description:
            description = f"{now}: {plan.description}"
        mount = dataclasses.replace(plan, threads=self.readers, description=description)
        return dataclasses.replace(workload, mount=mount)

    def describe(self, workload: Workload) -> str:
        workload = self._own_readers(workload)
        return f"{self.description}; {workload.mount.description}"

    def run_once(self, bench: Bench, scenario: Scenario, workload: Workload) -> RunMetrics:
        workload = self._own_readers(workload)
        buf = new_buffer(workload.requested_bytes)
        work = Path(tempfile.mkdtemp(prefix="bmbench-"))
        run_no = len(list(bench.out_dir.glob(f"logs/{scenario.name}-{self.name}-*.log")))
        try:
            daemon = self.daemon(workload.store, scenario, work)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)  # the daemon removes it once it exists
            raise
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
            storage=storage_delta(before, after),
            stats_after=after,
            # many files: each costs about the same; one large file: its bytes
            serial=serial_part(
                process_deltas(before, after), "requests" if workload.files > 1 else "bytes"
            ),
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
                run.phase_storage[phase.name] = storage_delta(last_stats, now)
                last_stats = run.stats_after = now
        return run
