"""Fetch pool: at most one in-flight load per block, shared by every waiter.

A load reads the block from the disk tier when it has a valid copy, else from storage (and the
block is then offered to the disk tier). Running disk reads through the in-flight table too means
concurrent readers of a block cost one disk read or one GET, never several.

Two kinds of fetch share the in-flight table:
- *demand* fetches (a reader is waiting) start at once; they are bounded by the number of
  concurrent FUSE reads, not by the pool, so a reader never queues behind read-ahead;
- *prefetches* (read-ahead) wait for one of DATASET_MOUNT_READ_THREADS slots.
A demand read that finds its block queued as a prefetch promotes it: the fetch leaves the queue and
starts immediately.

Fetches run in the owner's nursery, not in the reader's task, so a reader whose FUSE request is
interrupted does not cancel a fetch other readers are waiting for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import trio

from blobmount.blocks.keys import BlobVersion, BlockKey, block_span
from blobmount.errors import StorageUnavailable
from blobmount.storage.base import StorageClient

log = logging.getLogger(__name__)


class DiskTier(Protocol):
    """The second cache layer (blobmount.blocks.disk_tier). `get` returns a verified block or
    None (never raises for a bad cache file: it is dropped and refetched); `put` queues a write
    in the background and never blocks."""

    async def get(self, key: BlockKey) -> bytes | None: ...

    def put(self, key: BlockKey, data: bytes) -> None: ...

    def statistics(self) -> object: ...


#: told about every block that arrives from storage or disk: (key, data, came_from_disk,
#: fetched_for_a_hint)
Arrival = Callable[[BlockKey, bytes, bool, bool], None]


@dataclass(frozen=True, slots=True)
class FetcherStats:
    in_flight: int
    queued: int
    demand_fetches: int
    prefetches: int
    promoted: int
    fetched_bytes: int
    disk_hits: int
    failed: int


#: told the outcome of a fetch (data or error) the moment it ends
Listener = Callable[[bytes | None, Exception | None], None]


class _Fetch:
    __slots__ = ("data", "done", "error", "hinted", "limiter", "listeners", "queue_scope", "urgent")

    def __init__(self, urgent: bool, limiter: trio.CapacityLimiter, hinted: bool) -> None:
        self.urgent = urgent
        self.limiter = limiter
        self.hinted = hinted
        self.listeners: list[Listener] = []
        self.done = trio.Event()
        self.data: bytes | None = None
        self.error: Exception | None = None
        self.queue_scope: trio.CancelScope | None = None

    def promote(self) -> None:
        self.urgent = True
        if self.queue_scope is not None:
            self.queue_scope.cancel()


class BlockFetcher:
    def __init__(
        self,
        storage: StorageClient,
        block_size: int,
        prefetch_slots: int,
        nursery: trio.Nursery,
        on_arrival: Arrival | None = None,
        disk: DiskTier | None = None,
    ) -> None:
        self._storage = storage
        self._disk = disk
        self._block_size = block_size
        self._limiter = trio.CapacityLimiter(max(1, prefetch_slots))
        self._nursery = nursery
        self._on_arrival = on_arrival
        self._in_flight: dict[BlockKey, _Fetch] = {}
        self._demand = 0
        self._prefetches = 0
        self._promoted = 0
        self._fetched_bytes = 0
        self._disk_hits = 0
        self._failed = 0

    def in_flight(self, key: BlockKey) -> bool:
        return key in self._in_flight

    async def get(self, key: BlockKey, version: BlobVersion, *, urgent: bool = True) -> bytes:
        """The block's bytes, fetching it unless a fetch is already under way.

        Raises whatever the storage client raised for this block (to every waiter).
        """
        fetch = self._in_flight.get(key)
        if fetch is None:
            fetch = self._start(key, version, urgent=urgent)
        elif urgent and not fetch.urgent:
            self._promoted += 1
            fetch.promote()
        await fetch.done.wait()
        if fetch.error is not None:
            raise fetch.error
        assert fetch.data is not None
        return fetch.data

    def prefetch(
        self,
        key: BlockKey,
        version: BlobVersion,
        listener: Listener,
        *,
        hint_slots: trio.CapacityLimiter | None = None,
    ) -> None:
        """Fetch a block in the background (queued for a prefetch slot) and call `listener`
        synchronously when it ends, before the block leaves the in-flight table, so no reader
        can miss it in between. With `hint_slots`, the fetch is for a hint: it queues for
        those slots instead, so hints never hold up read-ahead (and the reverse)."""
        fetch = self._in_flight.get(key)
        if fetch is None:
            fetch = self._start(key, version, urgent=False, hint_slots=hint_slots)
        fetch.listeners.append(listener)

    def _start(
        self,
        key: BlockKey,
        version: BlobVersion,
        *,
        urgent: bool,
        hint_slots: trio.CapacityLimiter | None = None,
    ) -> _Fetch:
        fetch = _Fetch(urgent, hint_slots or self._limiter, hint_slots is not None)
        self._in_flight[key] = fetch
        if urgent:
            self._demand += 1
        else:
            self._prefetches += 1
        self._nursery.start_soon(self._run, key, version, fetch)
        return fetch

    async def _run(self, key: BlockKey, version: BlobVersion, fetch: _Fetch) -> None:
        acquired = False
        try:
            if not fetch.urgent:
                with trio.CancelScope() as scope:
                    fetch.queue_scope = scope
                    await fetch.limiter.acquire_on_behalf_of(fetch)
                    acquired = True
                fetch.queue_scope = None
            start, length = block_span(key.index, self._block_size, version.size)
            from_disk = False
            data = None
            if self._disk is not None:
                data = await self._disk.get(key)
                from_disk = data is not None and len(data) == length
            if not from_disk:
                data = await self._storage.get_range(key.name, key.etag, start, length)
            assert data is not None
            if len(data) != length:
                # A version is immutable: a short block means the store is broken, not that the
                # blob shrank (that would be a new ETag). Never serve it.
                raise StorageUnavailable(
                    f"short block {key.index} of {key.name}: got {len(data)} of {length} bytes"
                )
            fetch.data = data
            if from_disk:
                self._disk_hits += 1
            else:
                self._fetched_bytes += len(data)
            if self._on_arrival is not None:
                self._on_arrival(key, data, from_disk, fetch.hinted)
        except Exception as exc:  # handed to every waiter
            self._failed += 1
            fetch.error = exc
        finally:
            if fetch.data is None and fetch.error is None:  # cancelled: the mount is closing
                fetch.error = StorageUnavailable(f"fetch of {key.name} cancelled")
            if acquired:
                fetch.limiter.release_on_behalf_of(fetch)
            for listener in fetch.listeners:
                try:
                    listener(fetch.data, fetch.error)
                except Exception:
                    log.exception("fetch listener failed")
            del self._in_flight[key]
            fetch.done.set()

    def statistics(self) -> FetcherStats:
        queued = sum(1 for f in self._in_flight.values() if f.queue_scope is not None)
        return FetcherStats(
            in_flight=len(self._in_flight),
            queued=queued,
            demand_fetches=self._demand,
            prefetches=self._prefetches,
            promoted=self._promoted,
            fetched_bytes=self._fetched_bytes,
            disk_hits=self._disk_hits,
            failed=self._failed,
        )
