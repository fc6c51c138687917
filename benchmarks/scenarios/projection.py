"""The report's projected per-mount ceiling on a bigger node (issue #25), by Amdahl's law from
the CPU this run measured: rate(N) <= min(1 / serial CPU per item, N / parallel CPU per item).

The parallel CPU per item is the whole process tree's with 2 processes (what spreading costs
included), taken from the small-files and large-sequential rows of `blobmount-2p`. The serial
part is measured in the same rows (`scenarios.serial_part`: the main process's CPU beyond its
share of the work, plus the time under the locks every process takes in turn); per GiB it comes
from the large-parallel row, whose readers open the file each (one reader's stream is served by
the process that opened it, which the projection states apart).
"""

from __future__ import annotations

from collections.abc import Iterable

from scenarios.plans import GiB
from scenarios.results import SystemResult

#: the node the projection is for, and the share of it a training job leaves the mount
NODE_CORES = 16
MOUNT_CORES_SHARED = 8
#: a standard storage account's request target: cold small files per second for the whole job
ACCOUNT_REQUESTS_S = 20_000


def _items(result: SystemResult, per_file: bool) -> float:
    return result.files if per_file else result.requested_bytes / GiB


def _cpu_per_item(result: SystemResult | None, per_file: bool) -> float | None:
    """The median run's tree CPU per file (s) or per GiB (s), or None without a usable row."""
    run = result.median if result is not None else None
    if result is None or run is None or run.client_cpu_s is None or not result.verified:
        return None
    items = _items(result, per_file)
    return run.client_cpu_s / items if items else None


def _serial_per_item(result: SystemResult | None, per_file: bool) -> float | None:
    """The median run's serial part per file (s) or per GiB (s), or None where not measured."""
    run = result.median if result is not None else None
    if result is None or run is None or run.serial is None or not result.verified:
        return None
    items = _items(result, per_file)
    return run.serial.total_s / items if items else None


def _bound(cores: int, parallel: float, serial: float | None) -> float:
    return min(cores / parallel, 1 / serial) if serial else cores / parallel


def projection_lines(results: Iterable[SystemResult]) -> list[str]:
    """The markdown section, or [] when the run has neither 2-process row."""
    rows = {(r.scenario, r.system): r for r in results}
    per_file = {
        p: _cpu_per_item(rows.get(("small-files", system)), per_file=True)
        for p, system in ((1, "blobmount"), (2, "blobmount-2p"))
    }
    per_gib = {
        p: _cpu_per_item(rows.get(("large-sequential", system)), per_file=False)
        for p, system in ((1, "blobmount"), (2, "blobmount-2p"))
    }
    serial_file = _serial_per_item(rows.get(("small-files", "blobmount-2p")), per_file=True)
    serial_gib = _serial_per_item(rows.get(("large-parallel", "blobmount-2p")), per_file=False)
    if per_file[2] is None and per_gib[2] is None:
        return []
    lines = [
        f"## Projected per-mount ceiling on a {NODE_CORES}-core node (Amdahl)",
        "",
        "From this run's whole-tree CPU (the daemon's processes, Azurite apart) and serial part "
        "(measured with 2 processes); rate(N) <= min(1 / serial CPU, N / parallel CPU per item):",
        "",
        "| | 1 process | 2 processes | serial part | "
        f"{NODE_CORES} cores for the mount | {MOUNT_CORES_SHARED} cores for the mount |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    c1, c2 = per_file[1], per_file[2]
    if c2 is not None:
        lines.append(
            "| cold small files (CPU per file; projected files/s) | "
            + (f"{c1 * 1000:.3f} ms | " if c1 is not None else "- | ")
            + f"{c2 * 1000:.3f} ms | "
            + (f"{serial_file * 1000:.3f} ms | " if serial_file is not None else "- | ")
            + f"{_bound(NODE_CORES, c2, serial_file):,.0f} | "
            + f"{_bound(MOUNT_CORES_SHARED, c2, serial_file):,.0f} |"
        )
    g1, g2 = per_gib[1], per_gib[2]
    if g2 is not None:
        lines.append(
            "| sequential reads (CPU s per GiB; projected GiB/s of CPU) | "
            + (f"{g1:.2f} s | " if g1 is not None else "- | ")
            + f"{g2:.2f} s | "
            + (f"{serial_gib:.3f} s | " if serial_gib is not None else "- | ")
            + f"{_bound(NODE_CORES, g2, serial_gib):.1f} | "
            + f"{_bound(MOUNT_CORES_SHARED, g2, serial_gib):.1f} |"
        )
    lines += [
        "",
        "Assumptions, each of which lowers the real figure:",
        "",
        "- each process's CPU per item stays what 2 processes spend here (measured with 2 "
        f"processes only; with {NODE_CORES} every process waiting in trio is also woken for "
        "requests others read, not measured);",
        "- the serial part is measured on this 2-core machine, where the processes, the "
        "readers and Azurite share the cores: a process holding a shared lock is often "
        "preempted, which lengthens the time under the lock (the same sections take about "
        "1 us each on an idle core); per GiB it is from the large-parallel row (each reader "
        "opens the file), and a job that sends read-order hints is bound by the main "
        "process's fetching instead, about one process's rate;",
        "- one reader's sequential stream is read ahead by one process: it stays near "
        + (f"{1 / g1:.1f} GiB/s" if g1 else "one process's rate")
        + " (1 / the 1-process CPU per GiB) however many cores there are;",
        "- the CPU figures are this machine's (its speed varies from day to day: compare the "
        "ceiling's MB/s across runs); a node's faster cores raise the bound in proportion;",
        "- storage and network are not the limit; on Azure they are: a standard account's "
        f"target is {ACCOUNT_REQUESTS_S:,} requests/s for the whole job, and a node's NIC "
        "(25-100 Gbit/s) caps sequential reads below the CPU bound.",
        "",
    ]
    return lines
