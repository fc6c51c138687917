"""Hinted blocks every process of the mount can read: one file per block in `/dev/shm`.

The main process fetches the blocks of the files the job hinted (hints/coordinator.py). Held in
its memory, they could only be read there, so every OPEN of a hinted file that landed in another
process was passed to the main process, and so was every READ of the handle: a socket round
trip and two wake-ups each, about 0.3 ms of CPU per file with 2 processes
(docs/developer-notes/multicore.md, "Hints spread over the processes"). On the shelf, a block is
a file of the mount's shared folder (tmpfs: memory, not disk), written with one `write`: a
reader that finds it shorter than the block (being written) takes that for a miss, and one that
finds it whole has all of it (a file grows only as its pages are filled). Another process
that gets the OPEN opens the file itself and reads the block from here, and tells the main
process of the open and the close (`fs/forward.py` notices) so that its coordinator moves the
window on and frees the room.

Only the main process writes and removes (its hinted store, blocks/hinted.py, keeps the index
and the byte count against DATASET_MOUNT_HINT_MEMORY_LIMIT); the others only read. The shelf takes
at most half the folder's free space at mount: the blocks beyond it stay in the main process's
memory, and the opens of their files are passed to it as before. A reader
that comes after the block was removed finds nothing and fetches the block as without hints:
a little time, never a wrong byte (a block is named by its blob's name, ETag and index).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
from pathlib import Path

from blobmount.blocks.keys import BlockKey

FOLDER = "hinted-blocks"
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


#: the share of the shared folder's free space (at mount) the shelf may fill: the folder also
#: holds the mount's tables, which must never find it full (a container's /dev/shm is 64 MiB
#: unless it is given more)
FREE_SPACE_SHARE = 0.5


class HintedShelf:
    """The shelf's folder; create it before forking."""

    def __init__(self, folder: Path, capacity: int) -> None:
        self.folder = os.fspath(folder)
        #: the most bytes the main process puts here; blocks beyond it stay in its memory
        self.capacity = capacity

    @classmethod
    def create(cls, parent: Path) -> HintedShelf:
        """The shelf in the mount's shared folder `parent` (made by whichever process comes
        first)."""
        folder = parent / FOLDER
        folder.mkdir(mode=0o700, exist_ok=True)
        space = os.statvfs(folder)
        return cls(folder, int(space.f_bavail * space.f_frsize * FREE_SPACE_SHARE))

    def path(self, key: BlockKey) -> str:
        return f"{self.folder}/{_version_digest(key.name, key.etag)}-{key.index}"

    def put(self, key: BlockKey, data: bytes) -> None:
        """(main process) Shelve a block; OSError if the folder is full (nothing is left).

        Written in place with one `write`, no temporary and rename (two system calls of the
        five a shelved block cost): a reader that comes while it is written gets fewer bytes
        than the block has, which `read` takes for a miss."""
        path = self.path(key)
        fd = os.open(path, _NEW, 0o600)
        try:
            written = os.write(fd, data)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        os.close(fd)
        if written != len(data):  # tmpfs writes all of it, or fails: a full folder
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise OSError(errno.ENOSPC, f"{written} of {len(data)} bytes shelved")

    def read(self, key: BlockKey, size: int) -> bytes | None:
        """The shelved block, `size` bytes, or None if it is not (or no longer) here."""
        try:
            fd = os.open(self.path(key), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            # a regular file gives all it has in one read; one byte more tells a longer one
            data = os.read(fd, size + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        return data if len(data) == size else None

    def holds(self, key: BlockKey) -> bool:
        try:
            os.stat(self.path(key))
        except OSError:
            return False
        return True

    def remove(self, key: BlockKey) -> None:
        """(main process) Take a block off the shelf."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(key))


@functools.lru_cache(maxsize=4096)
def _version_digest(name: str, etag: str) -> str:
    """A blob version's part of its blocks' names (each is looked up a few times: the open's
    check, the reads, the removal)."""
    version = f"{name}\0{etag}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(version, digest_size=12).hexdigest()
