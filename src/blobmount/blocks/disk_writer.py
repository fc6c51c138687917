"""Background write queue of the disk tier: bounded in bytes, drained by N writer tasks.

`submit` never blocks and never awaits: a block goes into the queue if the bytes already queued
leave room for it (DATASET_MOUNT_BLOCK_FILE_CACHE_MAX_QUEUE_SIZE), otherwise it is dropped and
counted; the reader that fetched it has its bytes either way. A queued block's bytes count
against the bound until its write has ended, since that is how long the queue holds them.

N writer tasks (DATASET_MOUNT_BLOCK_FILE_CACHE_WRITE_THREADS) share one channel; each hands one
block at a time to the `write` callback, which does the file I/O in a worker thread, so at most N
writes are in progress. A block already queued is not queued twice, and `pending` lets readers
take a block straight from the queue before it reaches the disk.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import trio

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class WriteOutcome(enum.Enum):
    WRITTEN = "written"
    ALREADY_CACHED = "already_cached"  # a valid file was there (another mount, or earlier)
    NO_SPACE = "no_space"  # the cache had no room: skipped
    FAILED = "failed"  # an I/O error: skipped


@dataclass(frozen=True, slots=True)
class DiskWriterConfig:
    max_queue_bytes: int
    writers: int

    def __post_init__(self) -> None:
        if self.max_queue_bytes < 0:
            raise ValueError("max_queue_bytes must not be negative")
        if self.writers < 1:
            raise ValueError("writers must be at least 1")


@dataclass(frozen=True, slots=True)
class DiskWriterStats:
    max_queue_bytes: int
    writers: int
    queued_blocks: int  # waiting or being written
    queued_bytes: int
    peak_queued_bytes: int
    accepted: int
    duplicates: int  # already queued: not queued again
    dropped_queue_full: int
    dropped_queue_full_bytes: int
    written: int
    written_bytes: int
    already_cached: int
    dropped_no_space: int
    failed: int
    abandoned: int  # still queued when the tier closed


class DiskWriter(Generic[K]):
    def __init__(
        self,
        config: DiskWriterConfig,
        write: Callable[[K, bytes], Awaitable[WriteOutcome]],
    ) -> None:
        self.config = config
        self._write = write
        self._send, self._receive = trio.open_memory_channel[tuple[K, bytes]](math.inf)
        self._pending: dict[K, bytes] = {}
        self._queued_bytes = 0
        self._peak = 0
        self._accepted = 0
        self._duplicates = 0
        self._dropped = 0
        self._dropped_bytes = 0
        self._outcomes = dict.fromkeys(WriteOutcome, 0)
        self._written_bytes = 0
        self._abandoned = 0
        self._closed = False
        self.drained = trio.Event()  # set when `run` has returned

    def submit(self, key: K, data: bytes) -> bool:
        """Queue `data` to be written under `key`, unless the queue is full. Never blocks.
        True if queued (or already queued)."""
        if self._closed:
            return False
        if key in self._pending:
            self._duplicates += 1
            return True
        size = len(data)
        if self._queued_bytes + size > self.config.max_queue_bytes:
            self._dropped += 1
            self._dropped_bytes += size
            return False
        self._pending[key] = data
        self._queued_bytes += size
        self._peak = max(self._peak, self._queued_bytes)
        self._accepted += 1
        self._send.send_nowait((key, data))
        return True

    def pending(self, key: K) -> bytes | None:
        """The bytes of a block still in the queue (or being written), else None."""
        return self._pending.get(key)

    async def run(self) -> None:
        """Run the writer tasks until `close` and the queue is drained (or until cancelled;
        then blocks still queued are abandoned)."""
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(self.config.writers):
                    nursery.start_soon(self._worker, self._receive.clone())
                await self._receive.aclose()  # only the clones keep it open
        finally:
            self._abandoned += len(self._pending)
            self._pending.clear()
            self._queued_bytes = 0
            self.drained.set()

    def close(self) -> None:
        """Accept no more blocks; the workers finish what is queued, then `run` returns."""
        self._closed = True
        self._send.close()

    async def _worker(self, receive: trio.MemoryReceiveChannel[tuple[K, bytes]]) -> None:
        async with receive:
            async for key, data in receive:
                try:
                    outcome = await self._write(key, data)
                except Exception:  # a bug in a write must not stop the writers
                    log.exception("disk cache write failed")
                    outcome = WriteOutcome.FAILED
                finally:
                    if self._pending.pop(key, None) is not None:
                        self._queued_bytes -= len(data)
                self._outcomes[outcome] += 1
                if outcome is WriteOutcome.WRITTEN:
                    self._written_bytes += len(data)

    def statistics(self) -> DiskWriterStats:
        return DiskWriterStats(
            max_queue_bytes=self.config.max_queue_bytes,
            writers=self.config.writers,
            queued_blocks=len(self._pending),
            queued_bytes=self._queued_bytes,
            peak_queued_bytes=self._peak,
            accepted=self._accepted,
            duplicates=self._duplicates,
            dropped_queue_full=self._dropped,
            dropped_queue_full_bytes=self._dropped_bytes,
            written=self._outcomes[WriteOutcome.WRITTEN],
            written_bytes=self._written_bytes,
            already_cached=self._outcomes[WriteOutcome.ALREADY_CACHED],
            dropped_no_space=self._outcomes[WriteOutcome.NO_SPACE],
            failed=self._outcomes[WriteOutcome.FAILED],
            abandoned=self._abandoned,
        )
