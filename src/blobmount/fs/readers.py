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

    def fetch_at_open(self) -> bool:
        """Start the GET of a one-block file now, before its READ comes (see
        `ReadAheadScheduler.fetch_at_open`)."""
        return self._manager.fetch_at_open(self._handle)

    @property
    def shelved(self) -> bool:
        """Whether the file's hinted blocks are on the main process's shelf
        (blocks/shelf.py), where any process of the mount may read them."""
        return self._handle.shelved

    @property
    def shelf_reads(self) -> int:
        """Blocks this handle read from the shelf."""
        return self._handle.shelf_reads


class WholeFileReader:
    """Whole-file mode: reads are served from the local copy of the blob version (a small
    one's bytes in memory, else its cache entry)."""

    def __init__(self, cache: WholeFileCache, copy: LocalCopy) -> None:
        self._cache = cache
        self._copy: LocalCopy | None = copy

    async def read(self, offset: int, size: int) -> bytes | memoryview:
        copy = self._copy
        if copy is None:
            raise ValueError("read after close")
        if offset >= copy.size or size <= 0:
            return b""
        want = min(size, copy.size - offset)
        data = copy.data
        if data is not None:
            # a small file: its bytes stay in memory while it is open
            self._cache.served_bytes += want
            return memoryview(data)[offset : offset + want]
        buf = bytearray(want)
        # What the page cache holds is read right here (a just-downloaded file is all there);
        # only the rest goes to a worker thread, so a disk wait never stops the FUSE loop.
        got = _read_cached(copy.fd, buf, offset)
        if got < want:
            got += await trio.to_thread.run_sync(
                _read_into,
                copy.fd,
                memoryview(buf)[got:],
                offset + got,
                limiter=self._cache.read_limiter,
            )
        self._cache.served_bytes += got
        return memoryview(buf)[:got]

    def close(self) -> None:
        copy, self._copy = self._copy, None
        if copy is not None:
            self._cache.release(copy)

    def preload(self) -> bytes | None:
        """The whole file's bytes if its copy is in memory (a small file), counted as served:
        for the kernel's page cache, so that its reads need no READ request."""
        copy = self._copy
        if copy is None or copy.data is None:
            return None
        self._cache.served_bytes += copy.size
        self._cache.preloaded += 1
        return copy.data


def _read_cached(fd: int, buf: bytearray, offset: int) -> int:
    """Bytes read into `buf` from the page cache alone (RWF_NOWAIT): 0 if none are there."""
    if not _NOWAIT:
        return 0  # no way to ask without waiting
    try:
        return os.preadv(fd, [buf], offset, _NOWAIT)
    except (BlockingIOError, OSError):
        return 0


def _read_into(fd: int, view: memoryview, offset: int) -> int:
    """Fill `view` from `offset` (blocking); fewer bytes only at the end of the file."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
