"""How long this process has held the locks that every process of a mount takes in turn.

In a mount served by several processes (DATASET_MOUNT_WORKER_PROCESSES), a request is handled by
whichever process read it, so no process does more than its share of the work, except where
the processes queue for one lock: while one holds the lock of the open-versions table or appends
to the log of inode names, any other that needs it waits. That time is the serial part of the
mount (Amdahl), along with whatever the main process does alone. Each such section adds its time
here, from the moment the lock is granted to the moment it is given back, and the stats report
it per process (`process_figures`). Locks that only a few requests share (a slot of the handle
table or of the disk budget) and shared locks (readers of the name log, who do not exclude each
other) are not counted.

A plain counter: the sections run on the trio thread, and a rare addition from another thread
that lands between the read and the write of another loses a few microseconds of a diagnostic.
"""

from __future__ import annotations

import time

_held_ns = 0
_clock = time.perf_counter_ns


def granted() -> int:
    """The clock reading to pass to `released` once the lock is given back."""
    return _clock()


def released(granted_ns: int) -> None:
    """Count the time since `granted_ns` (a `granted()` reading) as held."""
    global _held_ns
    _held_ns += _clock() - granted_ns


def held_s() -> float:
    """Seconds this process has held the mount-wide locks, since it started (a forked process
    starts from its parent's figure; the stats compare figures over an interval)."""
    return _held_ns / 1e9
