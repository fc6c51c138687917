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

Prefetches of adjacent blocks are *coalesced*: up to `coalesce_bytes` of them (8 MiB: four 2 MiB
blocks) are one ranged GET in one prefetch slot, split into blocks as it lands. Fewer, larger
requests cost less per byte everywhere (per-request CPU here, latency and transactions at the
service; Azurite even hashes every range of 4 MiB or less). Demand fetches stay one block each, so
a waiting reader never waits for more than its block.

Fetches run in the owner's nursery, not in the reader's task, so a reader whose FUSE request is
interrupted does not cancel a fetch other readers are waiting for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import trio

from blobmount.blocks.keys import BlobVersion, BlockKey, block_span
from blobmount.errors import StorageUnavailable
from blobmount.storage.base import StorageClient

log = logging.getLogger(__name__)

#: adjacent prefetched blocks are fetched together up to this many bytes per request
COALESCE_BYTES = 8 * 1024 * 1024


class DiskTier(Protocol):
    """The second cache layer (blobmount.blocks.disk_tier). `get` returns a verified block or
    None (never raises for a bad cache file: it is dropped and refetched); given the block's
    `size`, it may read a small block without a thread hop. `put` queues a write in the
    background and never blocks."""

    async def get(self, key: BlockKey, size: int | None = None) -> bytes | None: ...

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
    #: blocks that rode along in another block's request (prefetch coalescing)
    coalesced: int


#: told the outcome of a fetch (data or error) the moment it ends
Listener = Callable[[bytes | None, Exception | None], None]


class _Fetch:
    __slots__ = (
        *("data", "done", "error", "hinted", "key", "limiter", "listeners", "queue_scope"),
        "urgent",
    )

    def __init__(
        self, key: BlockKey, urgent: bool, limiter: trio.CapacityLimiter, hinted: bool
    ) -> None:
        self.key = key
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
        coalesce_bytes: int = COALESCE_BYTES,
    ) -> None:
        self._storage = storage
        self._disk = disk
        self._block_size = block_size
        #: how many adjacent blocks one prefetch request may carry
        self.coalesce_blocks = max(1, coalesce_bytes // block_size)
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
        self._coalesced = 0

    def in_flight(self, key: BlockKey) -> bool:
        return key in self._in_flight

    async def get(self, key: BlockKey, version: BlobVersion, *, urgent: bool = True) -> bytes:
        """The block's bytes, fetching it unless a fetch is already under way.

        Raises whatever the storage client raised for this block (to every waiter).
        """
        if urgent:
            fetch = self._urgent_fetch(key, version)
        else:
            fetch = self._in_flight.get(key) or self._start(key, version, urgent=False)
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

    def fetch_soon(self, key: BlockKey, version: BlobVersion, listener: Listener) -> None:
        """Fetch a block a read is about to want, as that read would (no queue for a prefetch
        slot), calling `listener` as `prefetch` does; one already in flight is joined."""
        self._urgent_fetch(key, version).listeners.append(listener)

    def _urgent_fetch(self, key: BlockKey, version: BlobVersion) -> _Fetch:
        """The fetch of a block a read wants: the one in flight (promoted past the prefetch
        queue if it waits there), or a new one that needs no slot."""
        fetch = self._in_flight.get(key)
        if fetch is None:
            return self._start(key, version, urgent=True)
        if not fetch.urgent:
            self._promoted += 1
            fetch.promote()
        return fetch

    def prefetch_adjacent(
        self, version: BlobVersion, first: int, listeners: Sequence[Listener]
    ) -> None:
        """Prefetch blocks first, first+1, ... (one per listener) of `version`, adjacent ones
        not yet in flight together, up to `coalesce_blocks` per request. Each listener is told
        about its own block, as `prefetch` would."""
        run: list[_Fetch] = []
        for offset, listener in enumerate(listeners):
            key = BlockKey(version.name, version.etag, first + offset)
            fetch = self._in_flight.get(key)
            if fetch is not None:  # already coming: join it, and end the run before it
                fetch.listeners.append(listener)
                self._launch(version, run)
                run = []
                continue
            fetch = self._register(key, urgent=False)
            fetch.listeners.append(listener)
            run.append(fetch)
            if len(run) == self.coalesce_blocks:
                self._launch(version, run)
                run = []
        self._launch(version, run)

    def _start(
        self,
        key: BlockKey,
        version: BlobVersion,
        *,
        urgent: bool,
        hint_slots: trio.CapacityLimiter | None = None,
    ) -> _Fetch:
        fetch = self._register(key, urgent=urgent, hint_slots=hint_slots)
        self._launch(version, [fetch])
        return fetch

    def _register(
        self, key: BlockKey, *, urgent: bool, hint_slots: trio.CapacityLimiter | None = None
    ) -> _Fetch:
        """A new fetch of `key` in the in-flight table (not started yet: see _launch)."""
        fetch = _Fetch(key, urgent, hint_slots or self._limiter, hint_slots is not None)
        self._in_flight[key] = fetch
        if urgent:
            self._demand += 1
        else:
            self._prefetches += 1
        return fetch

    def _launch(self, version: BlobVersion, run: list[_Fetch]) -> None:
        if run:
            if len(run) > 1:
                self._coalesced += len(run) - 1
            self._nursery.start_soon(self._run, version, run)

    async def _run(self, version: BlobVersion, run: list[_Fetch]) -> None:
        """Load the blocks of `run` (adjacent, in order; they share a slot and a request)."""
        lead = run[0]
        acquired = False
        try:
            if not any(f.urgent for f in run):
                try:  # a free slot needs no queue (and no cancel scope to leave it by)
                    lead.limiter.acquire_on_behalf_of_nowait(lead)
                    acquired = True
                    # still yield once, as a queued prefetch would: demand fetches started in
                    # the same step send their GETs first
                    await trio.lowlevel.cancel_shielded_checkpoint()
                except trio.WouldBlock:
                    with trio.CancelScope() as scope:
                        for fetch in run:  # promoting any of them skips the queue for all
                            fetch.queue_scope = scope
                        await lead.limiter.acquire_on_behalf_of(lead)
                        acquired = True
                    for fetch in run:
                        fetch.queue_scope = None
            await self._load(version, run)
        except Exception as exc:  # handed to every waiter of a block that did not land
            for fetch in run:
                if fetch.data is None:
                    self._failed += 1
                    fetch.error = exc
        finally:
            if acquired:
                lead.limiter.release_on_behalf_of(lead)
            for fetch in run:
                self._finish(fetch)

    async def _load(self, version: BlobVersion, run: list[_Fetch]) -> None:
        """Blocks from the disk tier where it has them, the rest from storage: one GET for each
        stretch of adjacent blocks the disk tier did not have."""
        stretch: list[_Fetch] = []
        for fetch in run:
            size = self._span(fetch, version)[1]
            data = await self._disk.get(fetch.key, size) if self._disk is not None else None
            if data is not None and len(data) == size:
                self._disk_hits += 1
                self._land(fetch, data, from_disk=True)
                await self._get(version, stretch)
                stretch = []
            else:
                stretch.append(fetch)
        await self._get(version, stretch)

    def _span(self, fetch: _Fetch, version: BlobVersion) -> tuple[int, int]:
        return block_span(fetch.key.index, self._block_size, version.size)

    async def _get(self, version: BlobVersion, stretch: list[_Fetch]) -> None:
        if not stretch:
            return
        spans = [self._span(f, version) for f in stretch]
        lengths = [length for _, length in spans]
        start = spans[0][0]
        if len(stretch) == 1:
            parts = [await self._storage.get_range(version.name, version.etag, start, lengths[0])]
        else:
            # cut as it arrives, one block each: a block never holds the whole answer alive
            parts = await self._storage.get_range_parts(version.name, version.etag, start, lengths)
        got = [len(part) for part in parts]
        if got != lengths:
            # A version is immutable: a short answer means the store is broken, not that the
            # blob shrank (that would be a new ETag). Never serve it.
            raise StorageUnavailable(
                f"short read of {version.name} at block {stretch[0].key.index}: "
                f"got {sum(got)} of {sum(lengths)} bytes"
            )
        self._fetched_bytes += sum(lengths)
        for fetch, data in zip(stretch, parts, strict=True):
            self._land(fetch, data, from_disk=False)

    def _land(self, fetch: _Fetch, data: bytes, *, from_disk: bool) -> None:
        fetch.data = data
        if self._on_arrival is not None:
            self._on_arrival(fetch.key, data, from_disk, fetch.hinted)

    def _finish(self, fetch: _Fetch) -> None:
        if fetch.data is None and fetch.error is None:  # cancelled: the mount is closing
            fetch.error = StorageUnavailable(f"fetch of {fetch.key.name} cancelled")
        for listener in fetch.listeners:
            try:
                listener(fetch.data, fetch.error)
            except Exception:
                log.exception("fetch listener failed")
        del self._in_flight[fetch.key]
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
            coalesced=self._coalesced,
        )
