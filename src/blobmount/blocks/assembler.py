"""Assembling a read from blocks.

Lookup order for each block of a read: the handle's own buffer (blocks it is reading now and its
read-ahead), the hinted blocks (fetched ahead for a file the job said it would read next, see
hinted.py), the RAM tier, an in-flight load, a new load (the disk tier when it has the block,
else storage; see fetcher.py). A read returns as soon as its own blocks are there; it never waits
for read-ahead. Buffers share the bytes objects with the RAM tier, so a block held by both costs
its size once.

This is the hot path of every read: a buffer or RAM-tier hit runs no more Python calls than it
must (measure before adding any).
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from blobmount.blocks.fetcher import BlockFetcher
from blobmount.blocks.handles import BlockHandle
from blobmount.blocks.hinted import HintedBlocks
from blobmount.blocks.keys import BlockKey, block_span, blocks_covering
from blobmount.blocks.ram_tier import RamTier
from blobmount.blocks.scheduler import ReadAheadScheduler


@dataclass(frozen=True, slots=True)
class ReadStats:
    reads: int
    bytes_served: int
    buffer_hits: int
    hinted_hits: int
    ram_hits: int
    storage_waits: int
    storage_wait_s: float
    prefetch_used: int  # prefetched blocks a read used


class ReadAssembler:
    """Serves a read of a handle's version from its blocks, finding each block where it is at
    hand or waiting for its load; tells the read-ahead scheduler about each read first."""

    def __init__(
        self,
        block_size: int,
        scheduler: ReadAheadScheduler,
        hinted: HintedBlocks,
        ram: RamTier,
        fetcher: BlockFetcher,
    ) -> None:
        self._block_size = block_size
        self._hinted = hinted
        self._ram = ram
        self._fetcher = fetcher
        # bound once: a read calls them as it would its own methods
        self._on_read = scheduler.on_read
        self._retain = scheduler.retain
        self._fetch_first = scheduler.fetch_at_open
        self._reads = 0
        self._bytes_served = 0
        self._buffer_hits = 0
        self._hinted_hits = 0
        self._ram_hits = 0
        self._storage_waits = 0
        self._storage_wait_s = 0.0
        self._prefetch_used = 0

    async def read(self, handle: BlockHandle, offset: int, size: int) -> bytes | memoryview:
        """Bytes [offset, offset+size) of the handle's version, short only at end of file.

        A read inside one block is a memoryview of the cached block (no copy: pyfuse3 hands
        any buffer to the kernel); a read across blocks is joined into new bytes.

        Raises StorageError subclasses (BlobChanged when the blob was replaced).
        """
        version = handle.version
        bsize = self._block_size
        indices = blocks_covering(offset, size, bsize, version.size)
        self._reads += 1
        if not indices:
            return b""
        self._on_read(handle, indices[0], indices[-1])

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

    def fetch_at_open(self, handle: BlockHandle) -> bool:
        """Start the GET of a one-block file as it is opened (`ReadAheadScheduler.
        fetch_at_open`), unless its block is here or coming already (hinted, in the RAM tier,
        in flight: a hint's fetch, which the read joins). True if it started."""
        version = handle.version
        key = BlockKey(version.name, version.etag, 0)
        if key in self._hinted or key in self._ram or self._fetcher.in_flight(key):
            return False
        return self._fetch_first(handle)

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
        size = block_span(index, self._block_size, version.size)[1]
        data = self._hinted.take(key, size, shelved=handle.shelved)
        if data is not None:
            self._hinted_hits += 1
            if handle.shelved:
                handle.shelf_reads += 1
        elif (data := self._ram.get(key)) is not None:
            self._ram_hits += 1
        else:
            started = trio.current_time()
            try:
                data = await self._fetcher.get(key, version, urgent=True)
            finally:
                self._storage_waits += 1
                self._storage_wait_s += trio.current_time() - started
            # a hinted fetch this read joined left its block in the hinted store as it landed
            self._hinted.discard(key)
            if index in handle.prefetched:
                # this read joined the handle's own read-ahead of the block: it was used, and
                # no later buffer hit will say so (the kernel may never ask for it again)
                handle.prefetched.discard(index)
                self._prefetch_used += 1
        self._retain(handle, index, data, reserved=0)
        return data

    def statistics(self) -> ReadStats:
        return ReadStats(
            reads=self._reads,
            bytes_served=self._bytes_served,
            buffer_hits=self._buffer_hits,
            hinted_hits=self._hinted_hits,
            ram_hits=self._ram_hits,
            storage_waits=self._storage_waits,
            storage_wait_s=self._storage_wait_s,
            prefetch_used=self._prefetch_used,
        )
