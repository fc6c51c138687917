"""Read-ahead: what each open handle prefetches and holds, within one global memory budget.

After each read, a handle's buffer is trimmed to what its read-ahead policy still wants, and the
blocks of its window that are not at hand are fetched in the background, cut into coalesced
requests. Prefetches only start when the read-ahead budget has room for them; blocks a reader is
reading right now are always kept (they may overdraw the budget by at most two blocks per active
stream, see readahead.MAX_STREAMS). A window stops short of where another reader of the same
file began (see OpenHandles.others_start_in).

All of this is synchronous: buffers, pending sets and the budget change only between trio
checkpoints (docs/developer-notes/concurrency.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from blobmount.blocks.fetcher import BlockFetcher, Listener
from blobmount.blocks.handles import BlockHandle, OpenHandles
from blobmount.blocks.keys import BlobVersion, BlockKey, block_count, block_span
from blobmount.blocks.ram_tier import RamTier
from blobmount.blocks.readahead import ReadAheadPolicy

log = logging.getLogger(__name__)


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
class ReadAheadStats:
    prefetch_started: int
    prefetch_wasted: int  # prefetched blocks dropped, or landed too late, unread
    prefetch_skipped_budget: int
    open_handles: int


class ReadAheadScheduler:
    """Owns the handles' buffers: opens and closes handles, keeps or drops the blocks they
    hold, and starts the prefetches their read-ahead asks for while the budget has room."""

    def __init__(
        self,
        fetcher: BlockFetcher,
        ram: RamTier,
        budget: ReadAheadBudget,
        block_size: int,
        read_ahead_blocks: int,
    ) -> None:
        self._fetcher = fetcher
        self._ram = ram
        self._budget = budget
        self._block_size = block_size
        self._read_ahead_blocks = read_ahead_blocks
        #: readers per open version, to see where other readers of a file are
        self.open_handles = OpenHandles()
        self._handles = 0
        self._started = 0
        self._wasted = 0
        self._skipped = 0

    # -- handles ---------------------------------------------------------------------------

    def open(self, version: BlobVersion) -> BlockHandle:
        self._handles += 1
        blocks = block_count(version.size, self._block_size)
        handle = BlockHandle(version, ReadAheadPolicy(self._read_ahead_blocks, blocks))
        self.open_handles.add(handle)
        return handle

    def fetch_at_open(self, handle: BlockHandle) -> bool:
        """Start fetching the one block of a one-block file as it is opened, into the handle's
        buffer (its bytes count in the read-ahead budget until the handle drops them): the GET
        is then on the wire while the kernel answers the open and sends the READ, which any
        read of such a file is. False (nothing started) for an empty file or one of several
        blocks, or if the budget has no room for it."""
        version = handle.version
        if handle.policy.block_total != 1 or handle.buffer or handle.pending:
            return False
        if not self._budget.try_reserve(version.size):
            return False
        handle.pending.add(0)
        self._started += 1

        def landed(data: bytes | None, error: Exception | None) -> None:
            handle.pending.discard(0)
            if data is None or handle.closed or 0 in handle.buffer:
                # a failure is left to the read, which meets it itself (after its retries)
                self._budget.release(version.size)
                if data is not None and handle.closed:
                    self._wasted += 1
                return
            # kept whatever the read-ahead policy says: the handle has not read yet
            handle.buffer[0] = data
            handle.prefetched.add(0)

        self._fetcher.fetch_soon(BlockKey(version.name, version.etag, 0), version, landed)
        return True

    def close(self, handle: BlockHandle) -> None:
        if handle.closed:
            return
        handle.closed = True
        self._handles -= 1
        self.open_handles.remove(handle)
        for index in list(handle.buffer):
            self._drop(handle, index)

    # -- reads -----------------------------------------------------------------------------

    def on_read(self, handle: BlockHandle, first: int, last: int) -> None:
        """A read of blocks [first, last] begins: drop what the handle no longer wants, and
        start the read-ahead its policy asks for now."""
        ahead = handle.policy.on_read(first, last)
        if handle.buffer:
            wanted = handle.policy.wanted()
            for index in [i for i in handle.buffer if i not in wanted]:
                self._drop(handle, index)
        if ahead:  # empty for most reads of small files and for random reads
            self._schedule(handle, ahead)

    def retain(self, handle: BlockHandle, index: int, data: bytes, *, reserved: int) -> bool:
        """Keep a block in the handle's buffer if the handle still wants it; a reservation
        that is not used is given back."""
        if handle.closed or index in handle.buffer or index not in handle.policy.wanted():
            if reserved:
                self._budget.release(reserved)
            return False
        handle.buffer[index] = data
        if not reserved:
            self._budget.force_reserve(len(data))
        return True

    # -- read-ahead ------------------------------------------------------------------------

    def _schedule(self, handle: BlockHandle, ahead: range) -> None:
        version = handle.version
        end_of_part = self.open_handles.others_start_in(handle, ahead)
        if end_of_part is not None:
            ahead = range(ahead.start, end_of_part)
        todo: list[int] = []
        for index in ahead:
            if index in handle.buffer or index in handle.pending:
                continue
            if BlockKey(version.name, version.etag, index) in self._ram:
                continue
            todo.append(index)
        group = self._fetcher.coalesce_blocks
        at_end = ahead.stop >= handle.policy.block_total or end_of_part is not None
        if len(todo) < group and len(ahead) >= 2 * group and not at_end:
            # A wide window slides one block per block read: topping it up at once would make
            # every request one block. Wait until a whole request's worth is missing (the
            # window is at least twice that, so the reader is still well covered).
            return
        for run in _requests(todo, group):
            lengths = [block_span(i, self._block_size, version.size)[1] for i in run]
            if not self._budget.try_reserve(sum(lengths)):
                self._skipped += 1
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
                self._started += 1
                listeners.append(self._prefetch_listener(handle, index, length))
            self._fetcher.prefetch_adjacent(version, run[0], listeners)
            if len(run) < len(lengths):
                break

    def _fitting(self, lengths: list[int]) -> int:
        """How many of the first `lengths` the budget takes now (reserving them)."""
        taken = 0
        for length in lengths:
            if not self._budget.try_reserve(length):
                break
            taken += 1
        return taken

    def _prefetch_listener(self, handle: BlockHandle, index: int, reserved: int) -> Listener:
        def landed(data: bytes | None, error: Exception | None) -> None:
            handle.pending.discard(index)
            if data is None:
                # The reader will meet the same error on its own read, if it gets there.
                log.debug("prefetch of %s block %d failed: %s", handle.version.name, index, error)
                self._budget.release(reserved)
            elif self.retain(handle, index, data, reserved=reserved):
                handle.prefetched.add(index)
            elif index not in handle.buffer:
                self._wasted += 1  # the reader moved on before it arrived

        return landed

    def _drop(self, handle: BlockHandle, index: int) -> None:
        data = handle.buffer.pop(index)
        self._budget.release(len(data))
        if index in handle.prefetched:
            handle.prefetched.discard(index)
            self._wasted += 1

    def statistics(self) -> ReadAheadStats:
        return ReadAheadStats(
            prefetch_started=self._started,
            prefetch_wasted=self._wasted,
            prefetch_skipped_budget=self._skipped,
            open_handles=self._handles,
        )
