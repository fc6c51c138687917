"""Blocking file operations on whole-file cache entries.

Each runs in a worker thread, or on the trio thread while the disk answers fast (see
`WholeFileCache`). An entry is written as an unnamed file linked under its final name once complete
(`cachedir.unnamed`), or where the file system cannot, under a temporary name in its own folder
(`cachedir.layout.temporary_name`) renamed once complete. Either way a final name never holds a
partial file, and a crash leaves at most a temporary, which the next scan removes.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os

from blobmount.cachedir import unnamed
from blobmount.cachedir.layout import allocated_bytes, free_bytes, temporary_name

log = logging.getLogger(__name__)

_HASH_CHUNK = 4 * 1024 * 1024
_NEW_FILE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW


#: an entry's path: the cache builds plain strings (pathlib costs microseconds an open)
EntryPath = str | os.PathLike[str]


def open_entry(path: EntryPath) -> tuple[int, int] | None:
    """(fd, size) of an entry opened for reading and marked used now (its mtime is its LRU
    time); None if there is no such entry."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        with contextlib.suppress(OSError):
            os.utime(fd)
        return fd, os.fstat(fd).st_size
    except BaseException:
        os.close(fd)
        raise


def write_entry(path: str, data: bytes) -> tuple[int, int, int | None]:
    """Write `data` as the entry `path` (`_publish`).

    Returns (an fd reading the new entry, the bytes it occupies, free bytes left on the disk or
    None if unknown). Raises OSError with nothing left behind: no temporary, no entry.
    """
    fd = _publish(path, data)
    try:
        occupied = allocated_bytes(os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    free: int | None = None
    with contextlib.suppress(OSError):
        free = free_bytes(os.path.dirname(path))[0]
    return fd, occupied, free


def put_entry(path: str, data: bytes) -> None:
    """`write_entry` for a caller that needs nothing back: four system calls (create, write,
    publish, close), the fewest an entry can be published with; `write_entry` adds an fstat
    and a statfs, which the deferred writes on the trio thread do without."""
    os.close(_publish(path, data))


def _publish(path: str, data: bytes) -> int:
    """Write `data` to a new file that appears under the name `path` only once whole: an
    unnamed file linked into place (`cachedir.unnamed`), or where the file system has none, a
    temporary renamed over it. Returns an fd reading it. Raises OSError with no new name left.
    """
    fd = unnamed.open_unnamed(os.path.dirname(path))
    if fd is not None:
        try:
            _write_all(fd, data)
            unnamed.link_into_place(fd, path)
        except BaseException:
            os.close(fd)  # never linked: the kernel frees it
            raise
        return fd
    tmp, fd = _new_temporary(path)
    try:
        _write_all(fd, data)
        # the fd stays valid across the rename: it reads the entry without another open
        os.rename(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return fd


def _new_temporary(path: str) -> tuple[str, int]:
    """A new temporary for the entry `path` in its folder: (its name, an fd writing it)."""
    tmp = temporary_name(path)
    try:
        return tmp, os.open(tmp, _NEW_FILE, 0o600)
    except FileNotFoundError:  # the entry's fan-out folder is made on first use
        os.makedirs(os.path.dirname(tmp), exist_ok=True)
        return tmp, os.open(tmp, _NEW_FILE, 0o600)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        offset += os.pwrite(fd, view[offset:], offset)


def open_after_download(path: EntryPath) -> tuple[int, int, int]:
    """(fd, allocated bytes, free bytes on the disk) of an entry just renamed into place."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):
            os.utime(fd)  # the download set the blob's mtime; the cache orders by last use
        st = os.fstat(fd)
        return fd, allocated_bytes(st), free_bytes(os.path.dirname(path))[0]
    except BaseException:
        os.close(fd)
        raise


def make_folder(path: EntryPath) -> None:
    os.makedirs(path, exist_ok=True)


def md5_of(fd: int) -> bytes:
    digest = hashlib.md5()
    offset = 0
    while chunk := os.pread(fd, _HASH_CHUNK, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.digest()


def unlink(path: EntryPath) -> int:
    """Remove an entry; the bytes it occupied (0 if it was not there)."""
    try:
        size = allocated_bytes(os.stat(path))
        os.unlink(path)
    except FileNotFoundError:
        return 0
    return size
