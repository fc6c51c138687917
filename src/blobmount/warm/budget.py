"""How much cache a file will take, and whether warming it would start pruning. Pure.

Warming must never take the cache past its prune start: the pruner would then evict the least
recently used entries, which are what warm itself wrote first. So before each file, warm asks

    usage + pending + cost(file) < prune start

- *usage*: from the daemon's last stats snapshot: the cache's used and reserved bytes, plus (in
  block mode) the blocks still in the disk writer's queue;
- *pending*: what the files warm started have not yet shown in a snapshot (`Ledger`);
- *cost*: what the file will occupy, as the daemon's own space estimate counts it (allocated
  bytes; in block mode one file per block, with its header).

Each term errs high (a block fetched by read-ahead may count both in usage and in pending), so
warm may stop a little early, never late.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from blobmount.cachedir.space import allocated_size
from blobmount.errors import BlobmountError

if TYPE_CHECKING:
    from blobmount.cachedir.pruner import PrunerStats
    from blobmount.snapshot import MountSnapshot

#: a block file's fixed header (`blocks.disk_tier.HEADER`, 40 bytes) and its key: location,
#: blob name and ETag, length-prefixed. Generous: it is rounded up to the allocation unit anyway
BLOCK_FILE_OVERHEAD = 2048
DEFAULT_ALLOC_UNIT = 4096


class NoDiskCache(BlobmountError):
    """The mount keeps nothing on disk, so there is nothing to warm."""


class Mode(StrEnum):
    BLOCKS = "block"
    WHOLE_FILE = "whole-file"


@dataclass(frozen=True, slots=True)
class CacheView:
    """The figures of one stats snapshot that warm needs."""

    mode: Mode
    cache_dir: str
    used_bytes: int
    reserved_bytes: int  # room reserved for writes in progress
    capacity_bytes: int
    prune_start_bytes: int
    block_size: int  # 0 in whole-file mode
    queued_blocks: int  # block mode: the disk writer's queue
    queued_bytes: int
    max_queue_bytes: int
    not_written_blocks: int  # block mode: dropped (queue full, no space) or failed, ever
    not_cached_files: int  # whole-file mode: opens streamed instead of cached, ever
    cached_opens: int  # whole-file mode: opens served by a copy already cached, ever
    storage_requests: int  # ranged GETs, ever
    storage_bytes: int  # bytes they fetched

    @classmethod
    def from_snapshot(cls, snapshot: MountSnapshot) -> CacheView:
        """Raises NoDiskCache when the mount has no disk cache."""
        storage = snapshot.storage
        common = {
            "storage_requests": storage.range_requests,
            "storage_bytes": storage.range_bytes,
        }
        whole, disk = snapshot.whole_file, snapshot.disk
        if whole is not None:
            return cls(
                Mode.WHOLE_FILE,
                whole.cache_dir,
                *_space(whole.space),
                block_size=0,
                queued_blocks=0,
                queued_bytes=0,
                max_queue_bytes=0,
                not_written_blocks=0,
                not_cached_files=whole.fallbacks,
                cached_opens=whole.cached_opens,
                **common,
            )
        if disk is not None:
            writer = disk.writer
            return cls(
                Mode.BLOCKS,
                disk.cache_dir,
                *_space(disk.space),
                block_size=disk.block_size,
                queued_blocks=writer.queued_blocks,
                queued_bytes=writer.queued_bytes,
                max_queue_bytes=writer.max_queue_bytes,
                not_written_blocks=writer.dropped_queue_full
                + writer.dropped_no_space
                + writer.failed,
                not_cached_files=0,
                cached_opens=0,
                **common,
            )
        raise NoDiskCache(
            f"the mount at {snapshot.mountpoint} keeps no cache on disk (the disk tier is off: "
            "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED=false, or DATASET_MOUNT_CACHE_SIZE=0 in "
            "whole-file mode), so there is nothing to warm"
        )

    @property
    def queue_over_half(self) -> bool:
        """Block mode: more writes queued than half the queue. Blocks arriving at a full queue
        are dropped, not cached, so warm waits while this holds."""
        return self.queued_bytes * 2 > self.max_queue_bytes


def _space(space: PrunerStats) -> tuple[int, int, int, int]:
    return (space.used_bytes, space.reserved_bytes, space.capacity_bytes, space.prune_start_bytes)


@dataclass(frozen=True, slots=True)
class Sizer:
    """What files occupy in one mount's cache."""

    mode: Mode
    block_size: int
    alloc_unit: int = DEFAULT_ALLOC_UNIT

    @classmethod
    def for_view(cls, view: CacheView, alloc_unit: int) -> Sizer:
        return cls(view.mode, view.block_size, alloc_unit)

    def cost(self, nbytes: int) -> int:
        """Cache bytes for the first `nbytes` of a file (all of it, given its size)."""
        if nbytes <= 0:
            return 0
        if self.mode is Mode.WHOLE_FILE:
            return allocated_size(nbytes, self.alloc_unit)
        full, rest = divmod(nbytes, self.block_size)
        cost = full * allocated_size(self.block_size + BLOCK_FILE_OVERHEAD, self.alloc_unit)
        if rest:
            cost += allocated_size(rest + BLOCK_FILE_OVERHEAD, self.alloc_unit)
        return cost

    def cached_part(self, size: int, covered: int) -> int:
        """Of a file's cost, what is in the daemon's hands once `covered` bytes were read: every
        block a read touched was fetched whole (whole-file mode: all of it, once open)."""
        if self.mode is Mode.BLOCKS and covered > 0:
            covered = -(-covered // self.block_size) * self.block_size
        return self.cost(min(size, covered))

    def usage(self, view: CacheView) -> int:
        """What the cache holds or is about to hold, from a snapshot."""
        queued = view.queued_bytes + view.queued_blocks * (BLOCK_FILE_OVERHEAD + self.alloc_unit)
        return view.used_bytes + view.reserved_bytes + queued


def fits(usage: int, pending: int, cost: int, prune_start: int) -> bool:
    """Whether `cost` more bytes keep the cache below the usage at which pruning starts."""
    return usage + pending + cost < prune_start


@dataclass(slots=True)
class _Entry:
    size: int
    covered: int = 0  # bytes read (whole-file mode: the size, once open)
    seen: int = 0  # `covered` as of the last snapshot taken
    done: bool = False


class Ledger:
    """The cache bytes of the files warm started that the daemon's last snapshot may not show.

    Thread-safe: the reading threads report progress, the monitor takes snapshots. Usage is
    `mark()` before a snapshot is requested and `settle(mark)` once it is in: the snapshot
    then holds at least what was covered at the mark."""

    def __init__(self, sizer: Sizer) -> None:
        self._sizer = sizer
        self._files: dict[int, _Entry] = {}
        self._next = 0
        self._lock = threading.Lock()

    def start(self, size: int) -> int:
        with self._lock:
            self._next += 1
            self._files[self._next] = _Entry(size)
            return self._next

    def progress(self, ticket: int, covered: int) -> None:
        with self._lock:
            self._files[ticket].covered = covered

    def finish(self, ticket: int) -> None:
        with self._lock:
            self._files[ticket].done = True

    def mark(self) -> dict[int, tuple[int, bool]]:
        with self._lock:
            return {ticket: (e.covered, e.done) for ticket, e in self._files.items()}

    def settle(self, mark: dict[int, tuple[int, bool]]) -> None:
        with self._lock:
            for ticket, (covered, done) in mark.items():
                if done:
                    # finished (or failed) before the snapshot: all it brought is in it
                    self._files.pop(ticket, None)
                elif ticket in self._files:
                    self._files[ticket].seen = covered

    def pending(self) -> int:
        with self._lock:
            return sum(
                self._sizer.cost(e.size) - self._sizer.cached_part(e.size, e.seen)
                for e in self._files.values()
            )
