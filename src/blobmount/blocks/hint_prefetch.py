"""Hinted prefetch in block mode: the first blocks of each file a hint names, fetched into the
hinted store (hinted.py) before the job opens the file.

The hint coordinator (hints/coordinator.py) decides which files and when; this fetches their
blocks, in hint slots of their own so hints never hold up read-ahead (nor the reverse), and only
when the hinted store has room for all of a file's blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from blobmount.blocks.fetcher import BlockFetcher, Listener
from blobmount.blocks.hinted import HintedBlocks
from blobmount.blocks.keys import BlobVersion, BlockKey, block_count, block_span
from blobmount.blocks.ram_tier import RamTier


class HintPrefetcher:
    """Fetches the first blocks of hinted files into the hinted store, and lets them go when
    the coordinator gives a file up (the coordinator's `Prefetcher` in block mode)."""

    def __init__(
        self,
        hinted: HintedBlocks,
        ram: RamTier,
        fetcher: BlockFetcher,
        block_size: int,
        slots: int,
    ) -> None:
        self._hinted = hinted
        self._ram = ram
        self._fetcher = fetcher
        self._block_size = block_size
        self._slots = trio.CapacityLimiter(max(1, slots))

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
        bsize = self._block_size
        todo: list[tuple[BlockKey, int]] = []
        for index in range(min(max_blocks, block_count(version.size, bsize))):
            key = BlockKey(version.name, version.etag, index)
            if key in self._hinted or key in self._ram or self._fetcher.in_flight(key):
                continue
            todo.append((key, block_span(index, bsize, version.size)[1]))
        total = sum(length for _, length in todo)
        if todo and not self._hinted.reserve(total):
            return None
        for key, length in todo:
            self._fetcher.prefetch(
                key,
                version,
                self._listener(key, length, wanted, landed),
                hint_slots=self._slots,
            )
        return len(todo)

    def _listener(
        self,
        key: BlockKey,
        reserved: int,
        wanted: Callable[[], bool],
        landed: Callable[[bool], None],
    ) -> Listener:
        def done(data: bytes | None, error: Exception | None) -> None:
            if data is not None and wanted():
                self._hinted.put(key, data, reserved)
            else:
                self._hinted.unreserve(reserved)
            landed(data is not None)

        return done

    def drop_hinted(self, version: BlobVersion) -> int:
        """Give up the hinted blocks held for a version; the bytes freed."""
        return self._hinted.drop_file(version.name, version.etag)
