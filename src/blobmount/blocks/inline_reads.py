"""When the disk tier may read a block on the trio thread instead of in a worker thread.

A worker-thread hop costs about 90 µs of CPU alone, and with a dozen readers the GIL handoffs
around it cost several times that: a disk-tier hit of a 25 KB block took about 1 ms of daemon CPU
through a thread against 0.37 ms read in place (measured: 4,000 small files, 16 readers, page
cache dropped, so every read went to the disk). For large blocks the hop is a small part of the
work and the trio thread must not stall on it, so only small blocks are read in place, and only
while the disk answers quickly.

"Quickly" is judged on the average, not on one read: a read releases the GIL for its syscalls and
must win it back, and with busy threads that alone can take up to the 5 ms switch interval (4,000
cache misses checked in place during a cold read: median 23 µs, 99th percentile 1.2 ms, the
slowest 4 ms, none of it the disk's doing; a single-read 2 ms limit sent most reads to threads).
So reads move to threads when the running average (weight 1/8) exceeds `slow_s`, which a disk
that seeks trips within three reads, or at once when one read stalls longer than `stall_s`. They
stay there for a back-off that doubles up to `max_backoff_s` while the probes stay slow; a fast
probe resets it. A slow or hung disk therefore stalls the trio thread for at most a few reads per
back-off period. docs/developer-notes/concurrency.md, "Disk tier", has the trade-off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

#: blocks up to this many bytes may be read in place
INLINE_MAX_BYTES = 256 * 1024
#: a running average of reads in place above this is a slow disk
SLOW_S = 0.002
#: one read in place longer than this is a stall (well above the GIL's 5 ms switch interval)
STALL_S = 0.02
#: weight of the newest read in the running average
AVERAGE_WEIGHT = 1 / 8
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0


@dataclass(frozen=True, slots=True)
class InlineReadStats:
    reads: int  # blocks read on the trio thread
    slow_reads: int  # times the reads were found slow (each started a back-off)


class InlineReadGate:
    """Decides, read by read, whether a block is read in place; told how long each such read
    took. Single-threaded (the trio thread)."""

    def __init__(
        self,
        max_bytes: int = INLINE_MAX_BYTES,
        slow_s: float = SLOW_S,
        stall_s: float = STALL_S,
        first_backoff_s: float = FIRST_BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
    ) -> None:
        self.max_bytes = max_bytes
        self.slow_s = slow_s
        self.stall_s = stall_s
        self._average_s = 0.0
        self._first_backoff_s = first_backoff_s
        self._max_backoff_s = max_backoff_s
        self._backoff_s = first_backoff_s
        self._threads_until = 0.0
        self._inline = 0
        self._slow = 0

    def allows(self, size: int | None, now: float | None = None) -> bool:
        """True to read a block of `size` bytes (None: unknown, so no) in place now."""
        if size is None or size > self.max_bytes:
            return False
        return (time.monotonic() if now is None else now) >= self._threads_until

    def record(self, seconds: float, now: float | None = None) -> None:
        """An in-place read took `seconds`."""
        self._inline += 1
        if seconds <= self.slow_s:
            self._backoff_s = self._first_backoff_s  # a fast probe ends a slow spell
        self._average_s += (seconds - self._average_s) * AVERAGE_WEIGHT
        if seconds <= self.stall_s and self._average_s <= self.slow_s:
            return
        self._slow += 1
        self._average_s = 0.0  # the probes after the back-off judge the disk afresh
        self._threads_until = (time.monotonic() if now is None else now) + self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, self._max_backoff_s)

    def statistics(self) -> InlineReadStats:
        return InlineReadStats(reads=self._inline, slow_reads=self._slow)
