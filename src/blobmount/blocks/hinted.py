"""Blocks fetched ahead for hinted files, held until their reader takes them.

Hinted blocks live here, not in the RAM tier: a hint that is wrong, or early, must never push
out data a reader is about to use, and with `DATASET_MOUNT_MEMORY_CACHE_SIZE=0` (the seed's
setting for one-pass small files) there is no RAM tier to put them in. The store is bounded in
bytes (DATASET_MOUNT_HINT_MEMORY_LIMIT): room is reserved before a fetch starts, so blocks in
flight count too. A block leaves when a reader takes it (the read assembler moves it into that
handle's buffer), when its file is closed, or when the hint coordinator gives up on its file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from blobmount.blocks.keys import BlockKey


@dataclass(frozen=True, slots=True)
class HintedBlockStats:
    held_bytes: int
    held_blocks: int
    reserved_bytes: int  # in flight, room already taken
    limit_bytes: int
    taken: int  # blocks a reader took from here
    dropped: int  # blocks dropped unread
    dropped_bytes: int


class HintedBlocks:
    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        #: called whenever room is given back (the hint coordinator waits for it)
        self.on_free: Callable[[], None] | None = None
        self._blocks: dict[BlockKey, bytes] = {}
        #: (blob name, ETag) -> its keys here, so a file's blocks go together
        self._by_version: dict[tuple[str, str], set[BlockKey]] = {}
        self._held = 0
        self._reserved = 0
        self._taken = 0
        self._dropped = 0
        self._dropped_bytes = 0

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
        self._blocks[key] = data
        self._held += len(data)
        self._by_version.setdefault((key.name, key.etag), set()).add(key)

    def take(self, key: BlockKey) -> bytes | None:
        """The block, removed from here (a reader has it now), or None."""
        data = self._remove(key)
        if data is not None:
            self._taken += 1
        return data

    def drop_file(self, name: str, etag: str) -> int:
        """Drop what is held for one blob version; returns the bytes dropped."""
        freed = 0
        for key in list(self._by_version.get((name, etag), ())):
            data = self._remove(key)
            if data is not None:
                freed += len(data)
                self._dropped += 1
        self._dropped_bytes += freed
        return freed

    def _remove(self, key: BlockKey) -> bytes | None:
        data = self._blocks.pop(key, None)
        if data is None:
            return None
        self._held -= len(data)
        version = (key.name, key.etag)
        keys = self._by_version[version]
        keys.discard(key)
        if not keys:
            del self._by_version[version]
        self._freed()
        return data

    def statistics(self) -> HintedBlockStats:
        return HintedBlockStats(
            held_bytes=self._held,
            held_blocks=len(self._blocks),
            reserved_bytes=self._reserved,
            limit_bytes=self.limit,
            taken=self._taken,
            dropped=self._dropped,
            dropped_bytes=self._dropped_bytes,
        )
