"""BlockManager: serve reads of pinned blob versions from fixed-size blocks.

A thin composition of the parts that do the work, each with one job:
- ReadAssembler (assembler.py): a read from its blocks, in lookup order: the handle's buffer,
  the hinted blocks, the RAM tier, an in-flight load, a new load;
- ReadAheadScheduler (scheduler.py): the handles' buffers and read-ahead, within the read-ahead
  budget;
- HintPrefetcher (hint_prefetch.py): the first blocks of hinted files, into the hinted store;
- BlockFetcher (fetcher.py): one in-flight load per block, from the disk tier or storage.
The manager builds them, routes each block that arrives (RAM tier, disk tier), and sums up their
statistics.

Memory: the RAM tier is bounded by its capacity; blocks held by handles (current and prefetched)
are bounded by one global read-ahead budget (see scheduler.py); hinted blocks by the hinted
store's limit. Buffers share the bytes objects with the RAM tier, so a block held by both costs
its size once.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import trio

from blobmount.blocks.assembler import ReadAssembler
from blobmount.blocks.fetcher import COALESCE_BYTES, BlockFetcher, DiskTier, FetcherStats
from blobmount.blocks.handles import BlockHandle
from blobmount.blocks.hint_prefetch import HintPrefetcher
from blobmount.blocks.hinted import HintedBlocks, HintedBlockStats
from blobmount.blocks.keys import BlobVersion, BlockKey
from blobmount.blocks.ram_tier import RamTier, RamTierStats
from blobmount.blocks.scheduler import ReadAheadBudget, ReadAheadScheduler
from blobmount.storage.base import StorageClient

__all__ = ["BlockHandle", "BlockManager", "BlockManagerConfig", "BlockManagerStats"]


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


class BlockManager:
    """Builds the block reader's parts, wires them to each other, and is what the filesystem
    and the hint coordinator call."""

    #: ReadAssembler.read: bytes [offset, offset+size) of a handle's version
    read: Callable[[BlockHandle, int, int], Coroutine[Any, Any, bytes | memoryview]]
    #: ReadAheadScheduler.open: a handle pinned to a version
    open: Callable[[BlobVersion], BlockHandle]
    #: ReadAheadScheduler.close: give back everything the handle holds (idempotent)
    close: Callable[[BlockHandle], None]
    #: ReadAssembler.fetch_at_open: start a one-block file's GET as it is opened
    fetch_at_open: Callable[[BlockHandle], bool]

    def __init__(
        self,
        storage: StorageClient,
        config: BlockManagerConfig,
        nursery: trio.Nursery,
        disk_tier: DiskTier | None = None,
    ) -> None:
        self.config = config
        self._disk = disk_tier
        self.ram = RamTier(config.ram_bytes)
        self.budget = ReadAheadBudget(config.read_ahead_budget_bytes)
        self.hinted = HintedBlocks(config.hint_bytes)
        self.fetcher = BlockFetcher(
            storage,
            config.block_size,
            config.prefetch_slots,
            nursery,
            self._on_arrival,
            disk_tier,
            coalesce_bytes=config.coalesce_bytes,
        )
        self.scheduler = ReadAheadScheduler(
            self.fetcher, self.ram, self.budget, config.block_size, config.read_ahead_blocks
        )
        self.assembler = ReadAssembler(
            config.block_size, self.scheduler, self.hinted, self.ram, self.fetcher
        )
        self.hint_prefetch = HintPrefetcher(
            self.hinted, self.ram, self.fetcher, config.block_size, config.hint_slots
        )
        # The parts' own methods, bound here: a read or an open costs no extra call for
        # passing through the manager.
        self.read = self.assembler.read
        self.open = self.scheduler.open
        self.close = self.scheduler.close
        self.fetch_at_open = self.assembler.fetch_at_open

    # -- hints (the coordinator's Prefetcher) ----------------------------------------------

    def fetch_hinted(
        self,
        version: BlobVersion,
        max_blocks: int,
        wanted: Callable[[], bool],
        landed: Callable[[bool], None],
    ) -> int | None:
        """See HintPrefetcher.fetch_hinted."""
        return self.hint_prefetch.fetch_hinted(version, max_blocks, wanted, landed)

    def drop_hinted(self, version: BlobVersion) -> int:
        """Give up the hinted blocks held for a version; the bytes freed."""
        return self.hint_prefetch.drop_hinted(version)

    # -- wiring ----------------------------------------------------------------------------

    def _on_arrival(self, key: BlockKey, data: bytes, from_disk: bool, hinted: bool) -> None:
        # A hinted block waits in the hinted store, not the RAM tier: an early or wrong hint
        # must not push out blocks readers are using.
        if not hinted:
            self.ram.put(key, data)  # a disk hit is promoted to RAM
        if self._disk is not None and not from_disk:
            self._disk.put(key, data)

    def statistics(self) -> BlockManagerStats:
        reads = self.assembler.statistics()
        ahead = self.scheduler.statistics()
        return BlockManagerStats(
            reads=reads.reads,
            bytes_served=reads.bytes_served,
            buffer_hits=reads.buffer_hits,
            hinted_hits=reads.hinted_hits,
            ram_hits=reads.ram_hits,
            storage_waits=reads.storage_waits,
            storage_wait_s=reads.storage_wait_s,
            prefetch_started=ahead.prefetch_started,
            prefetch_used=reads.prefetch_used,
            prefetch_wasted=ahead.prefetch_wasted,
            prefetch_skipped_budget=ahead.prefetch_skipped_budget,
            read_ahead_bytes=self.budget.used,
            read_ahead_budget_bytes=self.budget.limit,
            open_handles=ahead.open_handles,
            ram=self.ram.statistics(),
            fetcher=self.fetcher.statistics(),
            hinted=self.hinted.statistics(),
        )
