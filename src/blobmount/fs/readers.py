"""The open modes behind one interface: what an open file handle reads through."""

from __future__ import annotations

import os
from typing import Protocol

import trio

from blobmount.blocks.manager import BlockHandle, BlockManager
from blobmount.wholefile.cache import LocalCopy, WholeFileCache


class OpenReader(Protocol):
    async def read(self, offset: int, size: int) -> bytes | memoryview: ...

    def close(self) -> None: ...


class BlockReader:
    """Block-based mode: reads go through the block manager (RAM/disk tiers, read-ahead)."""

    def __init__(self, manager: BlockManager, handle: BlockHandle) -> None:
        self._manager = manager
        self._handle = handle

    async def read(self, offset: int, size: int) -> bytes | memoryview:
        return await self._manager.read(self._handle, offset, size)

    def close(self) -> None:
        self._manager.close(self._handle)


class WholeFileReader:
    """Whole-file mode: reads are served from the local copy of the blob version."""

    def __init__(self, cache: WholeFileCache, copy: LocalCopy) -> None:
        self._cache = cache
        self._copy: LocalCopy | None = copy

    async def read(self, offset: int, size: int) -> bytes | memoryview:
        copy = self._copy
        if copy is None:
            raise ValueError("read after close")
        if offset >= copy.size or size <= 0:
            return b""
        # a worker thread: the page may not be in memory, and a disk wait must not stop the
        # FUSE loop; the fd stays open (and the file cannot be pruned) until close
        data = await trio.to_thread.run_sync(
            os.pread,
            copy.fd,
            min(size, copy.size - offset),
            offset,
            limiter=self._cache.read_limiter,
        )
        self._cache.served_bytes += len(data)
        return data

    def close(self) -> None:
        copy, self._copy = self._copy, None
        if copy is not None:
            self._cache.release(copy)
