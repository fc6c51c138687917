"""Blocks fetched ahead for hinted files, held until their reader takes them.

Hinted blocks live here, not in the RAM tier: a hint that is wrong, or early, must never push
out data a reader is about to use, and with `DATASET_MOUNT_MEMORY_CACHE_SIZE=0` (the seed's
setting for one-pass small files) there is no RAM tier to put them in. The store is bounded in
bytes (DATASET_MOUNT_HINT_MEMORY_LIMIT): room is reserved before a fetch starts, so blocks in
flight count too. A block leaves when a reader takes it (the read assembler moves it into that
handle's buffer), when its file is closed, or when the hint coordinator gives up on its file.

With several processes (DATASET_MOUNT_WORKER_PROCESSES) the main process's store keeps its
blocks on the shelf (blocks/shelf.py, `shelve_on`), where every process can read them; it still
counts them and removes them. The other processes' stores read from the shelf the blocks of a
file opened there in place of the main process (`read_shelf_of`), leaving them there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from blobmount.blocks.keys import BlockKey
from blobmount.blocks.shelf import HintedShelf

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HintedBlockStats:
    held_bytes: int
    held_blocks: int
    reserved_bytes: int  # in flight, room already taken
    limit_bytes: int
    taken: int  # blocks a reader took from here
    dropped: int  # blocks dropped unread
    dropped_bytes: int
    shelf_reads: int  # blocks this process read from the main process's shelf


class HintedBlocks:
    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        #: called whenever room is given back (the hint coordinator waits for it)
        self.on_free: Callable[[], None] | None = None
        #: key -> the block's bytes, or its length when it is on the shelf
        self._blocks: dict[BlockKey, bytes | int] = {}
        #: (blob name, ETag) -> its keys here, so a file's blocks go together
        self._by_version: dict[tuple[str, str], set[BlockKey]] = {}
        self._held = 0
        self._reserved = 0
        self._taken = 0
        self._dropped = 0
        self._dropped_bytes = 0
        self._shelf_reads = 0
        #: bytes of this store's blocks on the shelf
        self._shelved = 0
        #: the main process's shelf: where this store keeps its blocks (`shelve_on`)
        self._shelf: HintedShelf | None = None
        #: the other processes: the shelf they read (`read_shelf_of`)
        self._reading: HintedShelf | None = None

    def shelve_on(self, shelf: HintedShelf) -> None:
        """(main process of several) Keep the blocks on `shelf`, for every process to read."""
        self._shelf = shelf

    def read_shelf_of(self, shelf: HintedShelf) -> None:
        """(other processes) Read the main process's blocks from `shelf` (`take`)."""
        self._reading = shelf

    def __contains__(self, key: BlockKey) -> bool:
        return key in self._blocks

    def room_for(self, nbytes: int) -> bool:
        return self._held + self._reserved + nbytes <= self.limit

    def reserve(self, nbytes: int) -> bool:
        """Take room for a block about to be fetched; False if there is none."""
        if not self.room_for(nbytes):
            return False
        self._reserved += nbytes
        return True

    def unreserve(self, nbytes: int) -> None:
        self._reserved = max(0, self._reserved - nbytes)
        self._freed()

    def _freed(self) -> None:
        if self.on_free is not None:
            self.on_free()

    def put(self, key: BlockKey, data: bytes, reserved: int) -> None:
        """A reserved block arrived."""
        self._reserved = max(0, self._reserved - reserved)
        if key in self._blocks:
            self._freed()
            return
        held: bytes | int = data
        if self._shelf is not None and self._shelved + len(data) <= self._shelf.capacity:
            try:
                self._shelf.put(key, data)
                held = len(data)
                self._shelved += held
            except OSError as exc:  # kept here: the other processes pass its open to this one
                log.debug("hinted block of %s not shelved: %s", key.name, exc)
        self._blocks[key] = held
        self._held += len(data)
        self._by_version.setdefault((key.name, key.etag), set()).add(key)

    def on_shelf(self, key: BlockKey) -> bool:
        """Whether the block is on the shelf, where any process can read it."""
        if self._shelf is not None:
            return isinstance(self._blocks.get(key), int)
        return self._reading is not None and self._reading.holds(key)

    def take(self, key: BlockKey, size: int, *, shelved: bool = False) -> bytes | None:
        """The block (`size` bytes), removed from here (a reader has it now), or None.
        `shelved`: the main process holds the file's hinted blocks on the shelf this process
        reads: the block read from there, left for the main process to remove when the file
        is closed."""
        held = self._pop(key)
        if isinstance(held, int):
            assert self._shelf is not None
            data = self._shelf.read(key, held)
            self._shelf.remove(key)
        else:
            data = held
            if data is None and shelved and self._reading is not None:
                data = self._reading.read(key, size)
                if data is not None:
                    self._shelf_reads += 1
                return data
        if data is not None:
            self._taken += 1
        return data

    def discard(self, key: BlockKey) -> None:
        """A reader has the block already (it fetched it itself, or another process read it
        from the shelf): drop it from here, as taken."""
        if self._remove(key) is not None:
            self._taken += 1

    def hand_over(self, name: str, etag: str) -> None:
        """(main process) What is left of a version's shelved blocks was read by another
        process: they leave as taken, not as dropped unread."""
        for key in list(self._by_version.get((name, etag), ())):
            self.discard(key)

    def drop_file(self, name: str, etag: str) -> int:
        """Drop what is held for one blob version; returns the bytes dropped."""
        freed = 0
        for key in list(self._by_version.get((name, etag), ())):
            size = self._remove(key)
            if size is not None:
                freed += size
                self._dropped += 1
        self._dropped_bytes += freed
        return freed

    def _remove(self, key: BlockKey) -> int | None:
        """Forget a block and take it off the shelf if it is there: its length, or None."""
        held = self._pop(key)
        if isinstance(held, int):
            assert self._shelf is not None
            self._shelf.remove(key)
            return held
        return None if held is None else len(held)

    def _pop(self, key: BlockKey) -> bytes | int | None:
        """Forget a block: its bytes, or its length if it is on the shelf (still there)."""
        held = self._blocks.pop(key, None)
        if held is None:
            return None
        size = held if isinstance(held, int) else len(held)
        self._held -= size
        if isinstance(held, int):
            self._shelved -= size
        version = (key.name, key.etag)
        keys = self._by_version[version]
        keys.discard(key)
        if not keys:
            del self._by_version[version]
        self._freed()
        return held

    def statistics(self) -> HintedBlockStats:
        return HintedBlockStats(
            held_bytes=self._held,
            held_blocks=len(self._blocks),
            reserved_bytes=self._reserved,
            limit_bytes=self.limit,
            taken=self._taken,
            dropped=self._dropped,
            dropped_bytes=self._dropped_bytes,
            shelf_reads=self._shelf_reads,
        )
