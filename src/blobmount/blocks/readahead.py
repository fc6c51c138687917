"""Read-ahead policy: which blocks to prefetch after a read. Pure; no I/O.

Each open handle tracks a few *streams* (positions of readers moving forward through the file), so
one handle shared by several threads each reading its own part still gets read-ahead per part.
A stream earns read-ahead by reading forward: a read that starts a new stream away from the start
of the file prefetches nothing (random reads waste nothing); each step forward into a new block
doubles the window, up to DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT blocks.

`starts()` tells where this handle's readers began: the read-ahead scheduler stops other
handles' read-ahead of the same file there (see OpenHandles.others_start_in).
"""

from __future__ import annotations

from dataclasses import dataclass

INITIAL_WINDOW = 2
MAX_STREAMS = 8


@dataclass(slots=True)
class _Stream:
    last_block: int
    window: int
    tick: int
    first_block: int


class ReadAheadPolicy:
    def __init__(self, max_window: int, block_total: int) -> None:
        self.max_window = max_window
        self.block_total = block_total
        self._streams: list[_Stream] = []
        self._tick = 0
        #: the block of the handle's first read
        self._opened_at: int | None = None

    def on_read(self, first: int, last: int) -> range:
        """Record a read of blocks [first, last]; return the blocks worth prefetching now."""
        self._tick += 1
        if self._opened_at is None:
            self._opened_at = first
        stream = self._match(first)
        if stream is None:
            window = min(INITIAL_WINDOW, self.max_window) if first == 0 else 0
            stream = _Stream(last_block=last, window=window, tick=self._tick, first_block=first)
            self._streams.append(stream)
            if len(self._streams) > MAX_STREAMS:
                self._streams.remove(min(self._streams, key=lambda s: s.tick))
        else:
            if last > stream.last_block:
                grown = max(INITIAL_WINDOW, stream.window * 2)
                stream.window = min(grown, self.max_window)
                stream.last_block = last
            stream.tick = self._tick
        end = min(self.block_total, stream.last_block + 1 + stream.window)
        return range(stream.last_block + 1, end)

    def _match(self, first: int) -> _Stream | None:
        # A read continues a stream if it starts in the stream's current block, the next one, or
        # inside the window already prefetched (concurrent kernel reads can arrive out of order).
        for s in self._streams:
            if s.last_block - 1 <= first <= s.last_block + max(1, s.window):
                return s
        return None

    def wanted(self) -> set[int]:
        """Blocks worth keeping in a handle's buffer: near each stream and in its window."""
        keep: set[int] = set()
        for s in self._streams:
            keep.update(range(max(0, s.last_block - 1), s.last_block + 1 + s.window))
        return keep

    def stream_starts(self) -> list[int]:
        """First blocks of the streams that have read past them (readers under way)."""
        return [s.first_block for s in self._streams if s.last_block > s.first_block]

    def starts(self) -> list[int]:
        """Where this open handle's readers began: `stream_starts`, and the block of the
        handle's first read if that was not the file's first block. A reader that opens a file
        and begins in its middle is most likely reading its own part of it; it has not moved on
        yet while its neighbour's read-ahead, fed by reads that hit, grows towards it. (For a
        handle of random reads this is one block, and costs a sequential reader of the same
        file one wait there while the handle is open.)"""
        starts = self.stream_starts()
        if self._opened_at:
            starts.append(self._opened_at)
        return starts
