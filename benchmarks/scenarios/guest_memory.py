"""Free memory the VM has handed back to its hypervisor, and taking it back before a run.

This machine's kernel reports free memory to its host (virtio-balloon free page reporting, in
2 MiB pieces), and the host takes it back. The first write to such a page then costs a fault on
the host, which the guest sees as a slow memory copy: the kernel's copy of a FUSE reply into the
reader's page cache ran at about 1 GB/s instead of 8-10 on fresh memory, and was 44% of the
daemon's CPU time when eight readers read a 2 GiB file (`perf`). Which system pays how much of
that depends on how much memory was handed back just before it ran, not on the system.

`prefault_free_memory` writes once to as much memory as a run will take and frees it again,
just before the run, so that every system starts on memory the host has backed. Freed memory is
handed back again only a few seconds later, and the allocator reuses the most recently freed
pages first. A machine without free page reporting pays only the cost of zeroing the pages.
"""

from __future__ import annotations

import mmap
import time
from dataclasses import dataclass
from pathlib import Path

#: the kernel's free page reporting (virtio-balloon): free memory handed back to the hypervisor
PAGE_REPORTING = Path("/sys/module/page_reporting/parameters")
#: madvise: fault every page of the range in, writable, without touching it from Python (5.14+)
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
MEMINFO = Path("/proc/meminfo")
#: memory a prefault leaves free for everything else
PREFAULT_HEADROOM_BYTES = 4 << 30


def reported_free_memory_kib() -> int | None:
    """KiB of free memory this VM has handed back to its hypervisor so far, where the kernel
    says (a patched page_reporting module does); None elsewhere. Memory handed back is faulted
    in again, on the host, when it is next used: see docs/BENCHMARKING.md, Known limits."""
    try:
        return int((PAGE_REPORTING / "reported_kib").read_text())
    except (OSError, ValueError):
        return None


def available_memory_bytes(meminfo: Path = MEMINFO) -> int | None:
    """The kernel's MemAvailable, or None if it cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass(frozen=True, slots=True)
class Prefault:
    bytes: int
    seconds: float


def prefault_size(wanted: int, available: int | None) -> int:
    """`wanted`, cut so that PREFAULT_HEADROOM_BYTES stay available (0 if nothing is left)."""
    if available is None:
        return 0
    return max(0, min(wanted, available - PREFAULT_HEADROOM_BYTES)) // mmap.PAGESIZE * mmap.PAGESIZE


def prefault_free_memory(wanted: int) -> Prefault:
    """Write once to `wanted` bytes of free memory (less if the machine has not that much to
    spare) and free them again. Returns what was done; does nothing where madvise cannot."""
    size = prefault_size(wanted, available_memory_bytes())
    if size == 0:
        return Prefault(0, 0.0)
    started = time.perf_counter()
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(MADV_POPULATE_WRITE)
    except OSError:  # a kernel before 5.14: leave it
        return Prefault(0, 0.0)
    finally:
        region.close()
    return Prefault(size, time.perf_counter() - started)
