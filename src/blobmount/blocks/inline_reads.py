"""When the disk tier may read a block on the trio thread instead of in a worker thread.

A worker-thread hop costs about 90 µs of CPU alone, and with a dozen readers the GIL handoffs
around it cost several times that: a disk-tier hit of a 25 KB block took about 1 ms of daemon CPU
through a thread against 0.37 ms read in place (measured: 4,000 small files, 16 readers, page
cache dropped, so every read went to the disk). For large blocks the hop is a small part of the
work and the trio thread must not stall on it, so only small blocks are read in place, and only
while the disk answers quickly: a read slower than `slow_s` sends reads to threads for a while
(doubling up to `max_backoff_s` while reads stay slow). A slow or hung disk therefore stalls the
trio thread for at most one read per back-off period. docs/developer-notes/concurrency.md, "Disk
tier", has the trade-off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

#: blocks up to this many bytes may be read in place
INLINE_MAX_BYTES = 256 * 1024
#: a read in place slower than this is "slow"
SLOW_S = 0.002
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0


@dataclass(frozen=True, slots=True)
class InlineReadStats:
    reads: int  # blocks read on the trio thread
    slow_reads: int  # of those, slower than the limit (each started a back-off)


class InlineReadGate:
    """Decides, read by read, whether a block is read in place; told how long each such read
    took. Single-threaded (the trio thread)."""

    def __init__(
        self,
        max_bytes: int = INLINE_MAX_BYTES,
        slow_s: float = SLOW_S,
        first_backoff_s: float = FIRST_BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
    ) -> None:
        self.max_bytes = max_bytes
        self.slow_s = slow_s
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
            self._backoff_s = self._first_backoff_s
            return
        self._slow += 1
        self._threads_until = (time.monotonic() if now is None else now) + self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, self._max_backoff_s)

    def statistics(self) -> InlineReadStats:
        return InlineReadStats(reads=self._inline, slow_reads=self._slow)
