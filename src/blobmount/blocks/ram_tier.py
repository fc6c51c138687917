"""RAM tier: an LRU of blocks bounded in bytes (DATASET_MOUNT_MEMORY_CACHE_SIZE; 0 = off).

Synchronous on purpose: no awaits, so a lookup and an insert are atomic between trio
checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachetools import LRUCache

from blobmount.blocks.keys import BlockKey


@dataclass(frozen=True, slots=True)
class RamTierStats:
    capacity_bytes: int
    used_bytes: int
    entries: int
    hits: int
    misses: int
    evictions: int


class _CountingLRU(LRUCache[BlockKey, bytes]):
    evictions = 0

    def popitem(self) -> tuple[BlockKey, bytes]:
        self.evictions += 1
        return super().popitem()


class RamTier:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._lru = _CountingLRU(maxsize=max(1, capacity_bytes), getsizeof=len)
        self._hits = 0
        self._misses = 0

    def get(self, key: BlockKey) -> bytes | None:
        if self.capacity_bytes <= 0:
            return None
        data = self._lru.get(key)
        if data is None:
            self._misses += 1
        else:
            self._hits += 1
        return data

    def __contains__(self, key: BlockKey) -> bool:
        # a peek: neither counted as a hit nor moved in the LRU order
        return key in self._lru

    def put(self, key: BlockKey, data: bytes) -> None:
        # A block larger than the whole tier is not cached (cachetools would raise).
        if 0 < len(data) <= self.capacity_bytes:
            self._lru[key] = data

    def clear(self) -> None:
        self._lru.clear()

    def statistics(self) -> RamTierStats:
        return RamTierStats(
            capacity_bytes=self.capacity_bytes,
            used_bytes=int(self._lru.currsize),
            entries=len(self._lru),
            hits=self._hits,
            misses=self._misses,
            evictions=self._lru.evictions,
        )
