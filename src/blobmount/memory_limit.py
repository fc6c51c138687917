"""How much memory the daemon may use: the machine's RAM, or its cgroup's limit when tighter.

Used to size what the daemon chooses for itself (the automatic read-ahead cap), never what a
user set. A sidecar container usually runs under a cgroup memory limit far below the node's RAM,
so the limit, not the RAM, is what counts there. cgroup v2 (`memory.max`) and v1
(`memory.limit_in_bytes`) are both read; anything unreadable counts as "no limit".
"""

from __future__ import annotations

import os
from pathlib import Path

from blobmount.cgroups import controller_folders

#: cgroup v1 writes "no limit" as a huge number (page-rounded 2^63 - 1)
_NO_LIMIT_ABOVE = 1 << 60


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit():  # "max": no limit
        return None
    value = int(text)
    return value if 0 < value < _NO_LIMIT_ABOVE else None


def cgroup_limit_bytes(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """The tightest memory limit of this process's cgroup (v2 or v1), or None."""
    limits = [
        _read_limit(folder.path / ("memory.max" if folder.v2 else "memory.limit_in_bytes"))
        for folder in controller_folders("memory", proc_cgroup, root)
    ]
    return min((limit for limit in limits if limit is not None), default=None)


def usable_memory_bytes() -> int | None:
    """The machine's RAM or the cgroup limit, whichever is smaller (None: neither is known)."""
    known = [m for m in (physical_memory_bytes(), cgroup_limit_bytes()) if m is not None]
    return min(known, default=None)
