"""Space rules of the cache directory: how many bytes the cache may hold, and when to prune.

Pure, but for the counters a `CacheBudget` may share with the other processes of a mount.

Terms (all in bytes, as `du` counts them, i.e. allocated blocks, not apparent sizes):

- *used*: what the cache's files occupy now;
- *free*: what the file system still gives us (``statvfs().f_bavail * f_frsize``);
- *room* = used + free: what the cache could occupy if it took every free byte. Our own writes
  move bytes from free to used, so room only changes when something else on the disk grows or
  shrinks (another process filling the disk lowers it);
- *capacity*: what the cache may hold, from the settings:

  ====================================  ===================================================
  DATASET_MOUNT_CACHE_SIZE              capacity
  ====================================  ===================================================
  unset (unlimited)                     room - reserved
  N >= 0 (absolute)                     min(N, room - reserved)
  -N (leave N of the disk free)         min(room - N, room - reserved)
  ====================================  ===================================================

  where reserved is DATASET_RESERVED_FREE_DISK_SPACE, never below 0. Pruning starts when used
  reaches ``threshold * capacity`` and removes least-recently-used entries until used is at most
  ``target * capacity``. A write that would take used above capacity is not made.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from blobmount.cachedir.shared_budget import BudgetFigures

if TYPE_CHECKING:
    from blobmount.cachedir.shared_budget import SettledMark, SharedBudgetCounters

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SpaceConfig:
    """The space settings, as given (see the module docstring for what they mean)."""

    cache_size: int | None  # None: unlimited; negative: leave that much of the disk free
    reserved_free_bytes: int
    prune_threshold: float = 1.0
    prune_target: float = 0.7

    def __post_init__(self) -> None:
        if self.reserved_free_bytes < 0:
            raise ValueError("reserved_free_bytes must not be negative")
        if not 0.0 < self.prune_threshold <= 1.0:
            raise ValueError("prune_threshold must be in (0, 1]")
        if not 0.0 <= self.prune_target <= self.prune_threshold:
            raise ValueError("prune_target must be in [0, prune_threshold]")


def capacity_bytes(config: SpaceConfig, used_bytes: int, free_bytes: int) -> int:
    """How many bytes the cache may hold in all, its current contents included (never < 0)."""
    return _capacity_from_room(config, max(0, used_bytes) + max(0, free_bytes))


def _capacity_from_room(config: SpaceConfig, room: int) -> int:
    hard = room - config.reserved_free_bytes
    size = config.cache_size
    if size is None:
        limit = hard
    elif size >= 0:
        limit = min(size, hard)
    else:
        limit = min(room + size, hard)
    return max(0, limit)


def prune_start_bytes(config: SpaceConfig, capacity: int) -> int:
    """Usage at which pruning starts."""
    return math.floor(config.prune_threshold * capacity)


def prune_goal_bytes(config: SpaceConfig, capacity: int) -> int:
    """Usage pruning brings the cache down to (at most)."""
    return math.floor(config.prune_target * capacity)


def needs_pruning(config: SpaceConfig, used_bytes: int, capacity: int) -> bool:
    return used_bytes > 0 and used_bytes >= prune_start_bytes(config, capacity)


def allocated_size(nbytes: int, block_bytes: int) -> int:
    """Bytes a file of `nbytes` occupies on a file system allocating `block_bytes` at a time."""
    if nbytes <= 0:
        return 0
    unit = max(1, block_bytes)
    return -(-nbytes // unit) * unit


#: an age histogram keeps at most this many buckets (coarser buckets beyond), so pruning a
#: cache of any size needs a few hundred KiB, not a list of every entry
MAX_AGE_BUCKETS = 4096


#: finest bucket of an age histogram: a small cache under heavy churn turns over in less than
#: a second, and its LRU order still matters
AGE_RESOLUTION_S = 0.001


class AgeHistogram:
    """Bytes by last-use time, for choosing least-recently-used victims without holding the
    list of every entry: buckets of 1 ms, doubled in width whenever there are more than
    MAX_AGE_BUCKETS of them. Entries in one bucket count as equally old."""

    def __init__(self, max_buckets: int = MAX_AGE_BUCKETS) -> None:
        self.max_buckets = max(1, max_buckets)
        self.shift = 0  # bucket width is 2**shift * AGE_RESOLUTION_S
        self._bytes: dict[int, int] = {}

    @property
    def bucket_count(self) -> int:
        return len(self._bytes)

    def key(self, last_used_s: float) -> int:
        return _tick(last_used_s) >> self.shift

    def add(self, last_used_s: float, size_bytes: int) -> None:
        k = self.key(last_used_s)
        self._bytes[k] = self._bytes.get(k, 0) + size_bytes
        while len(self._bytes) > self.max_buckets:
            self.shift += 1
            merged: dict[int, int] = {}
            for old, size in self._bytes.items():
                merged[old >> 1] = merged.get(old >> 1, 0) + size
            self._bytes = merged

    def cut(self, need_bytes: int) -> LruCut:
        """What to remove to free `need_bytes`, oldest first."""
        below = 0
        for k in sorted(self._bytes):
            if below + self._bytes[k] >= need_bytes:
                return LruCut(self.shift, k, need_bytes - below)
            below += self._bytes[k]
        return LruCut(self.shift, math.inf, 0)  # everything


def _tick(last_used_s: float) -> int:
    return math.floor(last_used_s / AGE_RESOLUTION_S)


class LruCut:
    """Answers, entry by entry in any order, whether it is among the oldest to remove:
    everything older than the cut bucket, and from the cut bucket itself as much as is
    still needed (in the order asked)."""

    def __init__(self, shift: int, bucket: float, need_in_bucket: int) -> None:
        self.shift = shift
        self.bucket = bucket
        self.need_in_bucket = need_in_bucket

    def take(self, last_used_s: float, size_bytes: int) -> bool:
        k = _tick(last_used_s) >> self.shift
        if k < self.bucket:
            return True
        if k == self.bucket and self.need_in_bucket > 0:
            self.need_in_bucket -= size_bytes
            return True
        return False


class CacheBudget:
    """A process's running account of the cache: bytes in entries (the last scan, plus the
    writes since, minus removals), bytes reserved by writes in progress, and the room on the
    disk as of the last free-space reading.

    Alone, it counts this process's writes only. With `shared` (the processes of one mount),
    the used bytes, entries and reservations are every process's, and a reservation is checked
    and taken in one step against all of them, so the settings bound the whole folder. Room
    stays this process's own reading: each process checks against its own capacity.

    Synchronous and I/O-free apart from the shared counters' locks: callers on the trio thread
    read and change it between checkpoints.
    """

    def __init__(self, config: SpaceConfig, shared: SharedBudgetCounters | None = None) -> None:
        self.config = config
        self.shared = shared
        self._used = 0
        self._entries = 0
        self._reserved = 0
        self._room: int | None = None  # unknown until the first reading
        if shared is not None:
            shared.attach()

    def figures(self) -> BudgetFigures:
        """Usage and writes in progress: this process's, or every process's when shared (one
        read of the shared record)."""
        if self.shared is None:
            return BudgetFigures(self._used, self._entries, self._reserved, self._reserved)
        return self.shared.read()

    @property
    def used_bytes(self) -> int:
        return self.figures().used_bytes

    @property
    def entries(self) -> int:
        return self.figures().entries

    @property
    def reserved_bytes(self) -> int:
        """Writes in progress, every process's when shared."""
        return self.figures().reserved_bytes

    @property
    def own_reserved_bytes(self) -> int:
        """This process's writes in progress (its share of `reserved_bytes`)."""
        return self.figures().own_reserved_bytes

    @property
    def others_reserved_bytes(self) -> int:
        """Other processes' writes in progress (0 when not shared)."""
        figures = self.figures()
        return figures.reserved_bytes - figures.own_reserved_bytes

    @property
    def known(self) -> bool:
        return self._room is not None

    def observe_free(self, free_bytes: int) -> None:
        """A free-space reading taken between scans (after a write, or 0 after ENOSPC).

        It can only lower room. Our own writes do not change room, and a reading may be older
        than a write already settled, so it would still count that write's bytes as free.
        A lower reading means something else took space, and we take note of it. More room
        (something else freed space) is learnt at the next scan.
        """
        reading = max(0, self.used_bytes) + max(0, free_bytes)
        self._room = reading if self._room is None else min(self._room, reading)

    def settled_mark(self) -> SettledMark | None:
        """Taken as a scan starts, for `rebase` (None when not shared: nothing to correct)."""
        return None if self.shared is None else self.shared.mark()

    def rebase(
        self, used_bytes: int, entries: int, room_bytes: int, since: SettledMark | None = None
    ) -> None:
        """Adopt the numbers of a directory scan: usage, entries, and room as measured with
        it (never more than the truth; see `Pruner`). Reservations stay. When shared, `since`
        (the scan's `settled_mark`) adds what other processes wrote while it ran."""
        if self.shared is None:
            self._used = max(0, used_bytes)
            self._entries = max(0, entries)
        else:
            self.shared.rebase(used_bytes, entries, since)
        self._room = max(0, room_bytes)

    def capacity(self) -> int:
        return 0 if self._room is None else _capacity_from_room(self.config, self._room)

    def try_reserve(self, nbytes: int) -> bool:
        """Reserve room for a write of `nbytes` (allocated) if it fits under the capacity."""
        if self.shared is not None:
            return self.shared.try_reserve(nbytes, self.capacity())
        if self._used + self._reserved + nbytes > self.capacity():
            return False
        self._reserved += nbytes
        return True

    def settle(self, reserved: int, written: int) -> None:
        """A reserved write ended: `written` bytes (0 if nothing was written) are now in use."""
        if self.shared is not None:
            self.shared.settle(reserved, written)
            return
        self._reserved = max(0, self._reserved - reserved)
        if written > 0:
            self._used += written
            self._entries += 1

    def removed(self, nbytes: int, entries: int = 1) -> None:
        if self.shared is not None:
            self.shared.removed(nbytes, entries)
            return
        self._used = max(0, self._used - nbytes)
        self._entries = max(0, self._entries - entries)

    def should_prune(self) -> bool:
        if self.shared is None:
            used, reserved = self._used, self._reserved
        else:
            used, _, reserved, _ = self.shared.read()
        return needs_pruning(self.config, used + reserved, self.capacity())
