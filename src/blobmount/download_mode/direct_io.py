"""Writing a download's large files around the page cache (O_DIRECT).

A buffered write copies every byte into the page cache, and the kernel then writes those pages
back: on the benchmark machine that was 0.7 CPU s of the download's 1.7-2.1 CPU s per GiB, on
two cores that the network side also needs. An O_DIRECT write hands the user buffer to the
disk instead. It needs the buffer's address, the file offset and the length aligned to the
disk's block size, which a part received from the network is not, so each part is copied
once into one of a few reused page-aligned buffers and written from there; the unaligned ends
of a part (and whole small files) are written through the page cache as before.

Durability is unchanged: O_DIRECT data may still sit in the disk's own cache, and the final
`syncfs` (see `staging.sync_filesystem`) flushes it, as it flushes buffered pages.

Where the file system refuses O_DIRECT (at open or at a write), the file is written through the
page cache, silently: the bytes are the same, only the CPU cost differs.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from blobmount.units import MiB

log = logging.getLogger(__name__)

#: alignment of O_DIRECT offsets, lengths and buffers: the page size, which is a multiple of
#: every common disk's logical block size (512 B or 4 KiB)
ALIGN = mmap.PAGESIZE
#: files smaller than this are written through the page cache: their copy costs little, and a
#: second open per file would cost more than it saves
MIN_DIRECT_FILE_BYTES = 1 * MiB
#: aligned buffers kept for direct writes; a part that finds none free goes through the page
#: cache. Writes are short next to GETs, so a few are seldom all busy (see `statistics`).
DEFAULT_BUFFERS = 4

#: errors that mean "this file system or disk does not do O_DIRECT (here)", not a failure
_REFUSED = (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP)


@dataclass(frozen=True, slots=True)
class DirectWriteStats:
    direct_bytes: int  # written around the page cache
    buffer_busy_parts: int  # parts that went through the page cache because no buffer was free
    refused_files: int  # files whose file system refused O_DIRECT


def aligned_middle(offset: int, length: int) -> tuple[int, int]:
    """(skip, size): the longest span of [offset, offset + length) whose start and size are
    multiples of ALIGN, as its distance from `offset` and its length (size 0 if none)."""
    skip = -offset % ALIGN
    size = max(0, length - skip) // ALIGN * ALIGN
    return (skip, size) if size else (0, 0)


class DirectWrites:
    """O_DIRECT writes through at most `buffers` page-aligned buffers of `buffer_size` bytes,
    shared by every file of one download. Thread-safe: writes run in worker threads.

    The buffers are kept, not freed after each write, so their pages are faulted in once (on
    this VM a fresh 8 MiB buffer per part cost more than the copy into the page cache). Memory:
    at most `buffers` x `buffer_size` on top of the transfers' own.
    """

    def __init__(self, buffer_size: int, buffers: int = DEFAULT_BUFFERS) -> None:
        if buffer_size < ALIGN or buffers < 1:
            raise ValueError(f"need at least one buffer of at least {ALIGN} bytes")
        # a part's aligned middle is never longer than the part
        self._buffer_size = buffer_size // ALIGN * ALIGN
        self._max_buffers = buffers
        self._free: list[mmap.mmap] = []
        self._made = 0
        self._lock = threading.Lock()
        self._direct_bytes = 0
        self._busy = 0
        self._refused = 0

    def statistics(self) -> DirectWriteStats:
        with self._lock:
            return DirectWriteStats(self._direct_bytes, self._busy, self._refused)

    @property
    def buffers_made(self) -> int:
        return self._made

    def open(self, path: Path, size: int) -> int | None:
        """A write-only O_DIRECT descriptor of the existing file `path`, or None when the file
        is too small to be worth it or its file system refuses O_DIRECT."""
        if size < MIN_DIRECT_FILE_BYTES:
            return None
        try:
            return os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_DIRECT)
        except OSError as exc:
            if exc.errno not in _REFUSED:
                raise
            self._refused_once(path, exc)
            return None

    def write(self, fd: int, offset: int, data: memoryview) -> tuple[int, int]:
        """Write the aligned middle of `data` (which belongs at `offset`) through the O_DIRECT
        descriptor `fd`. Returns the span written, (skip, size) as from `aligned_middle`; (0, 0)
        when nothing was: no aligned middle, no free buffer. The caller writes the rest.

        Raises:
            RefusedError: the file system refused this write (part of the span may have been
                written: write the whole part another way, and stop using `fd`; close it only
                once no other thread can be writing through it).
            OSError: the write failed (disk full, I/O error).
        """
        skip, size = aligned_middle(offset, len(data))
        if size == 0:
            return 0, 0
        size = min(size, self._buffer_size)
        buffer = self._take()
        if buffer is None:
            return 0, 0
        try:
            buffer[:size] = data[skip : skip + size]
            _pwrite_all(fd, memoryview(buffer)[:size], offset + skip)
        except OSError as exc:
            if exc.errno in _REFUSED:
                raise RefusedError(exc.errno, exc.strerror) from None
            raise
        finally:
            self._give(buffer)
        with self._lock:
            self._direct_bytes += size
        return skip, size

    def refused(self, path: Path | None, exc: OSError) -> None:
        """Count (and log once) a file whose O_DIRECT write was refused."""
        self._refused_once(path, exc)

    def close(self) -> None:
        """Free the buffers (writes still running keep theirs until they end)."""
        with self._lock:
            free, self._free = self._free, []
        for buffer in free:
            buffer.close()

    def _take(self) -> mmap.mmap | None:
        with self._lock:
            if self._free:
                return self._free.pop()
            if self._made >= self._max_buffers:
                self._busy += 1
                return None
            self._made += 1
        # anonymous mmap: page-aligned, which O_DIRECT needs of the buffer's address
        return mmap.mmap(-1, self._buffer_size)

    def _give(self, buffer: mmap.mmap) -> None:
        with self._lock:
            self._free.append(buffer)

    def _refused_once(self, path: Path | None, exc: OSError) -> None:
        with self._lock:
            self._refused += 1
            first = self._refused == 1
        if first:
            log.info(
                "%s: the file system refused O_DIRECT (%s); writing through the page cache",
                path,
                exc.strerror,
            )


class RefusedError(OSError):
    """The file system refused an O_DIRECT write (EINVAL and the like)."""


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
