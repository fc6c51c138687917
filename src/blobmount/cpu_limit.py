"""How many CPUs the daemon may use: the ones its affinity allows, or fewer when its cgroup's CPU
quota is tighter.

Used by `DATASET_MOUNT_WORKER_PROCESSES=auto`: a sidecar container limited to 4 CPUs on a
96-core node should run 4 processes, not one per core of the node. cgroup v2 (`cpu.max`: quota
and period in microseconds, "max" for none) and v1 (`cpu.cfs_quota_us` / `cpu.cfs_period_us`,
-1 for none) are both read (`cgroups`); a quota of 1.5 CPUs
counts as 2 (two processes can use it all, one cannot). Anything unreadable counts as no quota.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from blobmount.cgroups import controller_folders


def affinity_cpus() -> int:
    """CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _quota_cpus(quota: str, period: str) -> int | None:
    """CPUs a quota of `quota` microseconds per `period` allows (rounded up), or None for none."""
    try:
        q, p = int(quota), int(period)
    except ValueError:  # "max": no quota
        return None
    if q <= 0 or p <= 0:  # v1 writes -1 for no quota
        return None
    return max(1, math.ceil(q / p))


def _read_v2(path: Path) -> int | None:
    try:
        fields = path.read_text().split()
    except OSError:
        return None
    return _quota_cpus(*fields) if len(fields) == 2 else None


def _read_v1(folder: Path) -> int | None:
    try:
        quota = (folder / "cpu.cfs_quota_us").read_text().strip()
        period = (folder / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    return _quota_cpus(quota, period)


def cgroup_cpus(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """The tightest CPU quota of this process's cgroup (v2 or v1), in CPUs, or None."""
    quotas = [
        _read_v2(folder.path / "cpu.max") if folder.v2 else _read_v1(folder.path)
        for folder in controller_folders("cpu", proc_cgroup, root)
    ]
    return min((q for q in quotas if q is not None), default=None)


def usable_cpus() -> int:
    """The CPUs of the affinity mask, or the cgroup's quota when it allows fewer."""
    known = [n for n in (affinity_cpus(), cgroup_cpus()) if n is not None]
    return min(known)
