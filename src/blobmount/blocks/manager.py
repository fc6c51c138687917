"""BlockManager: serve reads of pinned blob versions from fixed-size blocks.

Lookup order for a block: the handle's own buffer (blocks it is reading now and its read-ahead),
the hinted blocks (fetched ahead for a file the job said it would read next, see hinted.py), the
RAM tier, an in-flight load, a new load (the disk tier when it has the block, else storage; see
fetcher.py). A read returns as soon as its own blocks are there; it never waits for read-ahead.

Memory: the RAM tier is bounded by its capacity; blocks held by handles (current and prefetched)
are bounded by one global read-ahead budget. Prefetches are only started when the budget has room;
blocks a reader is reading right now are always kept (they may overdraw the budget by at most two
blocks per active stream, see readahead.MAX_STREAMS). Buffers share the bytes objects with the
RAM tier, so a block held by both costs its size once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from blobmount.blocks.fetcher import (
    COALESCE_BYTES,
    BlockFetcher,
    DiskTier,
    FetcherStats,
    Listener,
)
from blobmount.blocks.hinted import HintedBlocks, HintedBlockStats
from blobmount.blocks.keys import BlobVersion, BlockKey, block_count, block_span, blocks_covering
from blobmount.blocks.ram_tier import RamTier, RamTierStats
from blobmount.blocks.readahead import ReadAheadPolicy
from blobmount.storage.base import StorageClient

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BlockManagerConfig:
    block_size: int
    read_ahead_blocks: int
    prefetch_slots: int
    ram_bytes: int
    read_ahead_budget_bytes: int
    #: bytes of hinted blocks held for their readers (DATASET_MOUNT_HINT_MEMORY_LIMIT)
    hint_bytes: int = 0
    #: hinted fetches at once (DATASET_MOUNT_HINT_THREADS)
    hint_slots: int = 1
    #: adjacent read-ahead blocks share one request up to this many bytes
    coalesce_bytes: int = COALESCE_BYTES

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError("block_size must be positive")


#: starts of closed handles remembered per open file (many short-lived handles of random reads
#: must not make it grow without bound)
MAX_CLOSED_STARTS = 64


@dataclass(slots=True)
class _FileReaders:
    """The open handles of one blob version, and where the streams of its closed handles began
    (kept while any handle of the version is open; see BlockManager._others_start_in)."""

    handles: list[BlockHandle] = field(default_factory=list)
    closed_starts: dict[int, None] = field(default_factory=dict)  # an ordered set

    def remember_starts(self, handle: BlockHandle) -> None:
        for start in handle.policy.stream_starts():
            self.closed_starts.pop(start, None)
            self.closed_starts[start] = None
        while len(self.closed_starts) > MAX_CLOSED_STARTS:
            del self.closed_starts[next(iter(self.closed_starts))]

    def starts(self, reading: BlockHandle) -> list[int]:
        """Where readers began, as `reading` sees it: its own first read is no limit to it (a
        reader of a footer first, as Parquet and zip readers are, then reads from the start)."""
        out = list(self.closed_starts)
        for handle in self.handles:
            policy = handle.policy
            out.extend(policy.stream_starts() if handle is reading else policy.starts())
        return out


def _requests(indices: list[int], most: int) -> list[list[int]]:
    """Ascending block indices cut into runs of adjacent ones, each at most `most` long (the
    blocks of one coalesced request each)."""
    runs: list[list[int]] = []
    for index in indices:
        run = runs[-1] if runs else None
        if run is not None and index == run[-1] + 1 and len(run) < most:
            run.append(index)
        else:
            runs.append([index])
    return runs


@dataclass(frozen=True, slots=True)
class BlockManagerStats:
    reads: int
    bytes_served: int
    buffer_hits: int
    hinted_hits: int
    ram_hits: int
    storage_waits: int
    storage_wait_s: float
    prefetch_started: int
    prefetch_used: int
    prefetch_wasted: int
    prefetch_skipped_budget: int
    read_ahead_bytes: int
    read_ahead_budget_bytes: int
    open_handles: int
    ram: RamTierStats
    fetcher: FetcherStats
    hinted: HintedBlockStats


class ReadAheadBudget:
    """Bytes held in handle buffers, across all handles."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def try_reserve(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def force_reserve(self, n: int) -> None:
        self.used += n

    def release(self, n: int) -> None:
        self.used -= n
        assert self.used >= 0, "read-ahead budget released more than reserved"


@dataclass(eq=False, slots=True)
class BlockHandle:
    """Per-open-file state of the block reader."""

    version: BlobVersion
    policy: ReadAheadPolicy
    buffer: dict[int, bytes] = field(default_factory=dict)
    pending: set[int] = field(default_factory=set)
    prefetched: set[int] = field(default_factory=set)  # in buffer, not yet read
    closed: bool = False


class BlockManager:
    def __init__(
        self,
        storage: StorageClient,
        config: BlockManagerConfig,
        nursery: trio.Nursery,
        disk_tier: DiskTier | None = None,
    ) -> None:
        self.config = config
        self._nursery = nursery
        self._disk = disk_tier
        self.ram = RamTier(config.ram_bytes)
        self.budget = ReadAheadBudget(config.read_ahead_budget_bytes)
        self.hinted = HintedBlocks(config.hint_bytes)
        self._hint_slots = trio.CapacityLimiter(max(1, config.hint_slots))
        self.fetcher = BlockFetcher(
            storage,
            config.block_size,
            config.prefetch_slots,
            nursery,
            self._on_arrival,
            disk_tier,
            coalesce_bytes=config.coalesce_bytes,
        )
        self._handles = 0
        #: readers per open version, to see where other readers of a file are
        self._readers: dict[tuple[str, str], _FileReaders] = {}
        self._reads = 0
        self._bytes_served = 0
        self._buffer_hits = 0
        self._hinted_hits = 0
        self._ram_hits = 0
        self._storage_waits = 0
        self._storage_wait_s = 0.0
        self._prefetch_started = 0
        self._prefetch_used = 0
        self._prefetch_wasted = 0
        self._prefetch_skipped = 0

    # -- handles ---------------------------------------------------------------------------

    def open(self, version: BlobVersion) -> BlockHandle:
        self._handles += 1
        blocks = block_count(version.size, self.config.block_size)
        handle = BlockHandle(version, ReadAheadPolicy(self.config.read_ahead_blocks, blocks))
        key = (version.name, version.etag)
        self._readers.setdefault(key, _FileReaders()).handles.append(handle)
        return handle

    def close(self, handle: BlockHandle) -> None:
        if handle.closed:
            return
        handle.closed = True
        self._handles -= 1
        key = (handle.version.name, handle.version.etag)
        readers = self._readers[key]
        readers.handles.remove(handle)
        if readers.handles:
            readers.remember_starts(handle)
        else:
            del self._readers[key]
        for index in list(handle.buffer):
            self._drop(handle, index)

    # -- reads -----------------------------------------------------------------------------

    async def read(self, handle: BlockHandle, offset: int, size: int) -> bytes | memoryview:
        """Bytes [offset, offset+size) of the handle's version, short only at end of file.

        A read inside one block is a memoryview of the cached block (no copy: pyfuse3 hands
        any buffer to the kernel); a read across blocks is joined into new bytes.

        Raises StorageError subclasses (BlobChanged when the blob was replaced).
        """
        version = handle.version
        bsize = self.config.block_size
        indices = blocks_covering(offset, size, bsize, version.size)
        self._reads += 1
        if not indices:
            return b""
        ahead = handle.policy.on_read(indices[0], indices[-1])
        self._trim(handle)
        self._schedule(handle, ahead)

        end = min(offset + size, version.size)
        if len(indices) == 1:
            data = await self._block(handle, indices[0])
            base = indices[0] * bsize
            out: bytes | memoryview = memoryview(data)[offset - base : end - base]
        else:
            parts = []
            for index in indices:
                data = await self._block(handle, index)
                base = index * bsize
                lo, hi = max(offset, base) - base, min(end, base + len(data)) - base
                parts.append(memoryview(data)[lo:hi])  # views: the join is the one copy
            out = b"".join(parts)
        self._bytes_served += len(out)
        return out

    async def _block(self, handle: BlockHandle, index: int) -> bytes:
        data = handle.buffer.get(index)
        if data is not None:
            self._buffer_hits += 1
            if index in handle.prefetched:
                handle.prefetched.discard(index)
                self._prefetch_used += 1
            return data
        version = handle.version
        key = BlockKey(version.name, version.etag, index)
        data = self.hinted.take(key)
        if data is not None:
            self._hinted_hits += 1
        elif (data := self.ram.get(key)) is not None:
            self._ram_hits += 1
        else:
            started = trio.current_time()
            try:
                data = await self.fetcher.get(key, version, urgent=True)
            finally:
                self._storage_waits += 1
                self._storage_wait_s += trio.current_time() - started
            # a hinted fetch this read joined left its block in the hinted store as it landed
            self.hinted.take(key)
            if index in handle.prefetched:
                # this read joined the handle's own read-ahead of the block: it was used, and
                # no later buffer hit will say so (the kernel may never ask for it again)
                handle.prefetched.discard(index)
                self._prefetch_used += 1
        self._retain(handle, index, data, reserved=0)
        return data

    # -- read-ahead ------------------------------------------------------------------------

    def _others_start_in(self, handle: BlockHandle, ahead: range) -> int | None:
        """The first block in `ahead` where another reader of the same file started (see
        ReadAheadPolicy.starts; for `handle` itself only where its streams began), including
        readers that have closed their handles while the file is still open. Several readers
        each reading their own part of one file (8 DataLoader workers, each a slice, each with
        its own handle) would otherwise each read a whole window into the next part, which
        that part's reader has fetched already, or has even finished. A reader that does carry
        on past that point gets its read-ahead back one block later. (The stream `ahead`
        belongs to started before `ahead`, so it never cuts itself short.)"""
        readers = self._readers.get((handle.version.name, handle.version.etag))
        if readers is None:
            return None
        starts = readers.starts(handle)
        return min((s for s in starts if ahead.start <= s < ahead.stop), default=None)

    def _schedule(self, handle: BlockHandle, ahead: range) -> None:
        if not ahead:  # most reads of small files and random reads
            return
        version = handle.version
        end_of_part = self._others_start_in(handle, ahead)
        if end_of_part is not None:
            ahead = range(ahead.start, end_of_part)
        todo: list[int] = []
        for index in ahead:
            if index in handle.buffer or index in handle.pending:
                continue
            if BlockKey(version.name, version.etag, index) in self.ram:
                continue
            todo.append(index)
        group = self.fetcher.coalesce_blocks
        at_end = ahead.stop >= handle.policy.block_total or end_of_part is not None
        if len(todo) < group and len(ahead) >= 2 * group and not at_end:
            # A wide window slides one block per block read: topping it up at once would make
            # every request one block. Wait until a whole request's worth is missing (the
            # window is at least twice that, so the reader is still well covered).
            return
        for run in _requests(todo, group):
            lengths = [block_span(i, self.config.block_size, version.size)[1] for i in run]
            if not self.budget.try_reserve(sum(lengths)):
                self._prefetch_skipped += 1
                if run[0] != ahead.start:
                    # Wait for room for a whole request: a part of one would go out as a small
                    # request of its own, and the rest later as more (with eight readers at the
                    # budget's limit, half the GETs were of one block).
                    break
                # the reader's next block: what fits now, however small
                run = run[: self._fitting(lengths)]
                if not run:
                    break
            listeners = []
            for index, length in zip(run, lengths, strict=False):
                handle.pending.add(index)
                self._prefetch_started += 1
                listeners.append(self._prefetch_listener(handle, index, length))
            self.fetcher.prefetch_adjacent(version, run[0], listeners)
            if len(run) < len(lengths):
                break

    def _fitting(self, lengths: list[int]) -> int:
        """How many of the first `lengths` the budget takes now (reserving them)."""
        taken = 0
        for length in lengths:
            if not self.budget.try_reserve(length):
                break
            taken += 1
        return taken

    def _prefetch_listener(self, handle: BlockHandle, index: int, reserved: int) -> Listener:
        def landed(data: bytes | None, error: Exception | None) -> None:
            handle.pending.discard(index)
            if data is None:
                # The reader will meet the same error on its own read, if it gets there.
                log.debug("prefetch of %s block %d failed: %s", handle.version.name, index, error)
                self.budget.release(reserved)
            elif self._retain(handle, index, data, reserved=reserved):
                handle.prefetched.add(index)
            elif index not in handle.buffer:
                self._prefetch_wasted += 1  # the reader moved on before it arrived

        return landed

    def _retain(self, handle: BlockHandle, index: int, data: bytes, *, reserved: int) -> bool:
        """Keep a block in the handle's buffer if the handle still wants it; a reservation
        that is not used is given back."""
        if handle.closed or index in handle.buffer or index not in handle.policy.wanted():
            if reserved:
                self.budget.release(reserved)
            return False
        handle.buffer[index] = data
        if not reserved:
            self.budget.force_reserve(len(data))
        return True

    def _trim(self, handle: BlockHandle) -> None:
        if not handle.buffer:
            return
        wanted = handle.policy.wanted()
        for index in [i for i in handle.buffer if i not in wanted]:
            self._drop(handle, index)

    def _drop(self, handle: BlockHandle, index: int) -> None:
        data = handle.buffer.pop(index)
        self.budget.release(len(data))
        if index in handle.prefetched:
            handle.prefetched.discard(index)
            self._prefetch_wasted += 1

    # -- hints -------------------------------------------------------------------------------

    def fetch_hinted(
        self,
        version: BlobVersion,
        max_blocks: int,
        wanted: Callable[[], bool],
        landed: Callable[[bool], None],
    ) -> int | None:
        """Fetch the first `max_blocks` blocks of a file a hint says will be read soon into the
        hinted store. Returns how many fetches started (0: everything is already at hand), or
        None if the store has no room for them now (nothing started; try again later).

        As each block lands, it is kept only if `wanted()` still says so (the file has not been
        given up on or closed meanwhile); then `landed(ok)` is called."""
        bsize = self.config.block_size
        todo: list[tuple[BlockKey, int]] = []
        for index in range(min(max_blocks, block_count(version.size, bsize))):
            key = BlockKey(version.name, version.etag, index)
            if key in self.hinted or key in self.ram or self.fetcher.in_flight(key):
                continue
            todo.append((key, block_span(index, bsize, version.size)[1]))
        total = sum(length for _, length in todo)
        if todo and not self.hinted.reserve(total):
            return None
        for key, length in todo:
            self.fetcher.prefetch(
                key,
                version,
                self._hint_listener(key, length, wanted, landed),
                hint_slots=self._hint_slots,
            )
        return len(todo)

    def _hint_listener(
        self,
        key: BlockKey,
        reserved: int,
        wanted: Callable[[], bool],
        landed: Callable[[bool], None],
    ) -> Listener:
        def done(data: bytes | None, error: Exception | None) -> None:
            if data is not None and wanted():
                self.hinted.put(key, data, reserved)
            else:
                self.hinted.unreserve(reserved)
            landed(data is not None)

        return done

    def drop_hinted(self, version: BlobVersion) -> int:
        """Give up the hinted blocks held for a version; the bytes freed."""
        return self.hinted.drop_file(version.name, version.etag)

    def _on_arrival(self, key: BlockKey, data: bytes, from_disk: bool, hinted: bool) -> None:
        # A hinted block waits in the hinted store, not the RAM tier: an early or wrong hint
        # must not push out blocks readers are using.
        if not hinted:
            self.ram.put(key, data)  # a disk hit is promoted to RAM
        if self._disk is not None and not from_disk:
            self._disk.put(key, data)

    def statistics(self) -> BlockManagerStats:
        return BlockManagerStats(
            reads=self._reads,
            bytes_served=self._bytes_served,
            buffer_hits=self._buffer_hits,
            hinted_hits=self._hinted_hits,
            ram_hits=self._ram_hits,
            storage_waits=self._storage_waits,
            storage_wait_s=self._storage_wait_s,
            prefetch_started=self._prefetch_started,
            prefetch_used=self._prefetch_used,
            prefetch_wasted=self._prefetch_wasted,
            prefetch_skipped_budget=self._prefetch_skipped,
            read_ahead_bytes=self.budget.used,
            read_ahead_budget_bytes=self.budget.limit,
            open_handles=self._handles,
            ram=self.ram.statistics(),
            fetcher=self.fetcher.statistics(),
            hinted=self.hinted.statistics(),
        )
