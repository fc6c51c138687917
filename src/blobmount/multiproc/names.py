"""Inode number -> path for every node any process of the mount handed to the kernel.

Inode numbers are a hash of the path, so every process gives a path the same number; but a
process that gets GETATTR or OPEN for a number it never handed out has nothing to hash back
from. So every process publishes each node it hands to the kernel (a lookup reply, a
readdirplus entry) to an append-only log in the mount's shared folder, and a process that
meets an unknown number reads the records it has not seen yet.

Each process keeps its own dict of what it has read and its own position in the log (after the
fork each continues with its copy), so publishing a node the process already knows is one dict
check, and the log is only touched for new numbers. The log stores the number the publisher
used, which is not always the path's hash (hash collisions are probed to the next free number).

Layout: an 8-byte header, the offset where the whole records end, then records of
`<QI` (inode, path length in bytes) followed by the path in UTF-8 ('surrogatepass', as
`inode_for` hashes it). A writer appends under an exclusive lock and moves the header's end
only after its record is written, so a writer killed half-way leaves bytes past the end that
nobody reads and the next writer overwrites. Readers read up to the header's end under a
shared lock. The locks are POSIX record locks (`lockf`), which belong to a process: the file
descriptor is inherited through fork, and an `flock` on it would be one lock shared by all.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from blobmount.multiproc import lock_time

FILE_NAME = "names"

#: where the whole records end (an offset in the file), rewritten after each append
_HEADER = struct.Struct("<Q")
#: a record's head: inode number and the path's length in bytes
_RECORD = struct.Struct("<QI")
#: how much of the log a catch-up reads per system call
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class NamesStats:
    #: inode numbers this process resolves without reading the log
    known: int
    #: records this process read from the log (its own included only when read back)
    records_read: int
    #: records this process appended
    records_written: int
    #: the log's length when this process last read or wrote it
    log_bytes: int


class SharedNames:
    """The numbers handed to the kernel by any process and their mount-relative paths ('' is
    the root, no leading '/'). One process, one thread: the locks do not exclude threads."""

    __slots__ = ("_fd", "_paths", "_position", "log_bytes", "records_read", "records_written")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._paths: dict[int, str] = {}
        #: where this process's reading of the log stands
        self._position = _HEADER.size
        self.records_read = 0
        self.records_written = 0
        self.log_bytes = _HEADER.size

    @classmethod
    def create(cls, folder: Path) -> SharedNames:
        """A new, empty log in `folder` (made by the main process before it forks)."""
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        fd = os.open(folder / FILE_NAME, flags, 0o600)
        try:
            _write_all(fd, _HEADER.pack(_HEADER.size), 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def publish(self, inode: int, path: str) -> None:
        """Make `inode` resolvable to `path` in every process. Called for every node handed to
        the kernel, so a number this process already knows costs a dict check only."""
        if inode not in self._paths:
            self.publish_all([(inode, path)])

    def publish_all(self, nodes: Iterable[tuple[int, str]]) -> None:
        """`publish` each (inode, path) of `nodes`, the new ones in one append: one lock and
        three system calls for a readdirplus reply's entries instead of for each."""
        paths = self._paths
        new = [(inode, path) for inode, path in nodes if inode not in paths]
        if not new:
            return
        fd = self._fd
        fcntl.lockf(fd, fcntl.LOCK_EX)
        granted = lock_time.granted()
        try:
            end = self._catch_up()
            records = bytearray()
            written = []
            for inode, path in new:
                if inode in paths:  # another process published it (or it came twice)
                    continue
                encoded = path.encode("utf-8", "surrogatepass")
                records += _RECORD.pack(inode, len(encoded))
                records += encoded
                paths[inode] = path
                written.append(inode)
            try:
                if records:
                    _write_all(fd, records, end)
                    end += len(records)
                    _write_all(fd, _HEADER.pack(end), 0)  # the records count from here on
            except BaseException:
                for inode in written:  # not in the log: another process could not resolve them
                    del paths[inode]
                raise
        finally:
            lock_time.released(granted)
            fcntl.lockf(fd, fcntl.LOCK_UN)
        self._position = self.log_bytes = end
        self.records_written += len(written)

    def path_of(self, inode: int) -> str | None:
        """The path `inode` was handed out for, by this process or another; None if nobody
        published it."""
        path = self._paths.get(inode)
        if path is not None:
            return path
        fd = self._fd
        fcntl.lockf(fd, fcntl.LOCK_SH)
        try:
            self._catch_up()
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)
        return self._paths.get(inode)

    def statistics(self) -> NamesStats:
        return NamesStats(len(self._paths), self.records_read, self.records_written, self.log_bytes)

    def _catch_up(self) -> int:
        """Read the records appended since this process last looked (the caller holds a lock);
        the log's end. The first record of a number wins, as in every process."""
        fd, paths = self._fd, self._paths
        end: int = _HEADER.unpack(os.pread(fd, _HEADER.size, 0))[0]
        position, read, want = self._position, 0, _CHUNK
        while position < end:
            data = os.pread(fd, min(want, end - position), position)
            offset, size = 0, len(data)
            while offset + _RECORD.size <= size:
                inode, length = _RECORD.unpack_from(data, offset)
                start = offset + _RECORD.size
                if start + length > size:
                    want = max(_CHUNK, _RECORD.size + length)  # a record longer than a chunk
                    break
                if inode not in paths:
                    paths[inode] = data[start : start + length].decode("utf-8", "surrogatepass")
                offset = start + length
                read += 1
            if offset == 0 and (size == end - position or not data):
                break  # an incomplete record below the end: never written whole (not expected)
            position += offset
        self._position = position
        self.records_read += read
        self.log_bytes = end
        return end


def _write_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    written = os.pwrite(fd, data, offset)
    if written != len(data):  # a full /dev/shm: the header is not moved, the log stays whole
        raise OSError(errno.ENOSPC, f"short write to the shared names ({written} of {len(data)})")
