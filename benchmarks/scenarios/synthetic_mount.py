"""One timed run of a synthetic-group scenario through a fresh `blobmount mount --foreground`
of the synthetic:// source, with the CPU of the daemon's whole process tree.

`processes` asks the daemon for that many processes (`DATASET_MOUNT_WORKER_PROCESSES`, issue
#25); a daemon that does not know the setting ignores it, so every run also reports how many
processes the tree really had. The mount is always unmounted and its daemon stopped
(`scenarios.mounted.MountedDaemon`), on errors and timeouts too.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from blobmount.storage.synthetic import SyntheticDataset
from scenarios.base import FOREIGN_ENV
from scenarios.blobmount_system import BlobmountSystem
from scenarios.guest_memory import prefault_free_memory
from scenarios.measure import drop_kernel_caches, proc_status_kib
from scenarios.mounted import MountedDaemon
from scenarios.process_tree import TreeMeter, TreeUsage
from scenarios.readers import HintSource, read_through_mount
from scenarios.results import storage_delta
from scenarios.serial_part import SerialPart, process_deltas, serial_part
from scenarios.synthetic_group import SyntheticScenario, SyntheticWorkload, mismatch
from scenarios.verify import new_buffer

#: the issue #25 setting; today's daemon does not read it
PROCESSES_VAR = "DATASET_MOUNT_WORKER_PROCESSES"
#: memory written once before a run beyond the bytes it reads (as run.py does)
PREFAULT_SLACK_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class MountRun:
    """One timed, verified run through the mount."""

    seconds: float
    usage: TreeUsage
    verified: bool
    mismatch_at: str | None
    #: storage requests of the timed part (range_requests, range_bytes, ...)
    storage: dict[str, int] = field(default_factory=dict)
    #: the main process's VmHWM, bytes
    peak_rss_bytes: int | None = None
    #: the serial part over the timed part (None: the daemon lists no processes)
    serial: SerialPart | None = None


def daemon_env(mount_env: Mapping[str, str], work: Path, processes: int | None) -> dict[str, str]:
    """The caller's environment without any storage setting or credential, plus `mount_env`
    (a scenario's settings) and private cache and runtime dirs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN_ENV)}
    env.update(mount_env)
    env["DATASET_MOUNT_CACHE_DIR"] = str(work / "cache")
    env["XDG_RUNTIME_DIR"] = str(work / "run")
    env["XDG_STATE_HOME"] = str(work / "state")
    if processes is not None:
        env[PROCESSES_VAR] = str(processes)
    return env


def mount_daemon(uri: str, env: dict[str, str], work: Path) -> MountedDaemon:
    (work / "run").mkdir(parents=True, exist_ok=True)
    # no --log-file: the daemon logs to its stderr, which also holds whatever it prints before
    # logging starts (a traceback of a failed start), so one file tells the whole story
    cmd = [sys.executable, "-m", "blobmount", "mount", "--foreground", uri, str(work / "mnt")]
    daemon = MountedDaemon(cmd, env, work)
    daemon.log_file = work / "daemon.stderr"
    return daemon


def run_mount(
    uri: str,
    dataset: SyntheticDataset,
    scenario: SyntheticScenario,
    workload: SyntheticWorkload,
    processes: int | None,
    timeout_s: float,
    log_copy: Path | None = None,
    prefault: bool = True,
) -> MountRun:
    """Mount `uri` afresh, drop the kernel's caches, take back the memory the VM handed to its
    host (`prefault`, docs/BENCHMARKING.md "Known limits"), run the readers on the clock, and
    check every byte afterwards."""
    buf = new_buffer(workload.requested_bytes)
    work = Path(tempfile.mkdtemp(prefix="bmsynth-"))
    counters = BlobmountSystem()  # only for its `blobmount stats --json` reader
    try:
        daemon = mount_daemon(uri, daemon_env(scenario.mount_env, work, processes), work)
        daemon.log_copy = log_copy
        with daemon:
            before = counters.stats(daemon)
            drop_kernel_caches()
            if prefault:
                prefault_free_memory(workload.requested_bytes + PREFAULT_SLACK_BYTES)
            meter = TreeMeter(daemon.pid)
            meter.start()
            hints = HintSource(scenario.hint_window, daemon.env) if scenario.hint_window else None
            try:
                read_through_mount(
                    daemon.mountpoint,
                    workload.plan.jobs,
                    workload.plan.threads,
                    buf,
                    timeout_s,
                    hints,
                )
            except Exception as exc:
                raise RuntimeError(f"{exc}\n--- daemon log ---\n{daemon.log_tail()}") from exc
            usage = meter.stop()
            after = counters.stats(daemon)
            hwm = proc_status_kib(daemon.pid, "VmHWM")
    finally:
        # MountedDaemon removes its work dir once unmounted; a failed start may leave it
        if not (work / "mnt").is_mount():
            shutil.rmtree(work, ignore_errors=True)
    wrong = mismatch(workload.plan, buf, dataset)
    return MountRun(
        seconds=usage.wall_s,
        usage=usage,
        verified=wrong is None,
        mismatch_at=wrong,
        storage=storage_delta(before, after),
        peak_rss_bytes=None if hwm is None else hwm * 1024,
        serial=serial_part(
            process_deltas(before, after), "requests" if scenario.kind == "small" else "bytes"
        ),
    )
