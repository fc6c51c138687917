"""Which blob version the kernel may hold pages of, per inode, for every process of a mount.

The kernel keeps one page cache per inode, shared by every handle of it, whichever process
opened the handle. A single-process mount decides in `BlobFilesystem.open` whether an open may
keep the kernel's cached pages (`keep_cache`: only if they are of the version the handle is
pinned to) and whether it must bypass the page cache (`direct_io`: handles pinned to another
version are open, so pages of two versions must never meet in one cache). With several
processes on one FUSE connection, the open that fills the cache and the open that must not see
those pages may land in different processes (docs/developer-notes/multicore.md), so the record
those rules read has to be one record for the whole mount: this table.

Per inode it records the version (a 64-bit hash of the ETag) the kernel may hold pages of and
how many handles of that version, reading through the page cache, are open. The rules:

- a record of another version with open handles: the new handle bypasses the page cache
  (`direct_io`) and the record stays as it is; releasing such a handle changes nothing;
- a record of the same version: `keep_cache`, one more open handle;
- no record, or one of another version with no open handle: no `keep_cache` (the kernel may hold
  pages of any version whose record was evicted, and must drop them), and the record becomes
  this version with one open handle.

A release of a handle that used the page cache takes one from the count; the record stays with
0 (it still says which version the kernel may hold pages of).

The table is bounded: open addressing keyed by inode with linear probing inside a window of
slots. A new inode that finds no empty slot in its window takes the slot of an inode with no
open handle; that inode then reads as unknown, which costs it only `keep_cache` on its next open
(safe). When every slot of the window has open handles (never expected: it takes `window` open
inodes whose slots all fall in one window), the open is told to bypass the page cache and
nothing is recorded.

Layout of the `open-versions` file: a 64-byte header (records in use, evictions, fallbacks:
u64 each), then `slots` slots of 24 bytes: inode u64 (0 = empty), ETag hash u64, open count
u32, 4 bytes of padding. Memory: `slots * 24` bytes of address space (24 MiB for the default
2**20 slots); the file is sparse and on tmpfs only the pages touched take memory, 4 KiB per 170
slots.

Every update runs under an `fcntl.flock` of the file. A flock belongs to an open file
description, which a fork shares, so each process locks through a description of its own,
opened on its first call after a fork (through /proc/self/fd, which works even when the folder
is already gone). Hashes are computed before taking the lock: the critical section is a few
word reads and writes, once per open and once per release.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from blobmount.multiproc import lock_time

FILE_NAME = "open-versions"
SLOT_BYTES = 24
#: bytes before the first slot: records in use, evictions, fallbacks (u64 each), then reserved
HEADER_BYTES = 64
DEFAULT_SLOTS = 1 << 20
DEFAULT_WINDOW = 32

_WORD = 8
_HEADER_WORDS = HEADER_BYTES // _WORD
_SLOT_WORDS = SLOT_BYTES // _WORD
_RECORDS, _EVICTIONS, _FALLBACKS = 0, 1, 2
#: Fibonacci hashing spreads consecutive inode numbers over the table
_MIX = 0x9E3779B97F4A7C15
_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class OpenVersionStats:
    #: slots holding an inode's record (with or without open handles)
    records: int
    #: capacity of the table
    slots: int
    #: records dropped to make room for another inode (that inode's next open has no keep_cache)
    evictions: int
    #: opens told to bypass the page cache because their window was full of open inodes
    fallbacks: int


def home_slot(key: int, slots: int) -> int:
    """Where a 64-bit `key` starts looking in a table of `slots` (Fibonacci hashing spreads
    consecutive keys)."""
    return ((key * _MIX) & _U64) % slots


def version_hash(etag: str) -> int:
    """The 64-bit hash of a text: an ETag here, a blob name in `hinted_names`."""
    digest = hashlib.blake2b(etag.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class SharedOpenVersions:
    """Per inode, the version the kernel may hold pages of and its open handles, shared by
    every process forked after `create` (see the module's docstring)."""

    def __init__(self, path: Path, fd: int, slots: int, window: int) -> None:
        self.path = path
        self.slots = slots
        self.window = min(window, slots)
        self._fd = fd
        self._mmap = mmap.mmap(
            fd, HEADER_BYTES + slots * SLOT_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
        )
        self._view = memoryview(self._mmap)
        #: the file as u64 words (header, inode and hash of a slot) and as u32 halves (counts)
        self._words = self._view.cast("Q")
        self._halves = self._view.cast("I")
        self._pid = os.getpid()
        self._lock_fd = fd
        #: flock does not exclude threads sharing the description
        self._thread_lock = threading.Lock()
        #: when the lock was last granted (`lock_time`)
        self._granted = 0

    @classmethod
    def create(
        cls, folder: Path, slots: int = DEFAULT_SLOTS, *, window: int = DEFAULT_WINDOW
    ) -> SharedOpenVersions:
        """A new, empty table in `folder` (replacing any earlier one), to create before forking:
        the processes forked afterwards share it."""
        if slots < 1 or window < 1:
            raise ValueError(f"slots and window must be positive, not {slots} and {window}")
        path = folder / FILE_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, HEADER_BYTES + slots * SLOT_BYTES)  # sparse: all zero, all empty
            return cls(path, fd, slots, window)
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        """Unmap the table in this process (the file stays for processes still using it)."""
        if self._mmap.closed:
            return
        self._words.release()
        self._halves.release()
        self._view.release()
        self._mmap.close()
        if self._lock_fd != self._fd:
            os.close(self._lock_fd)
        os.close(self._fd)

    # -- the two calls of every open file --------------------------------------------------

    def opened(self, inode: int, etag: str) -> tuple[bool, bool]:
        """Record an open of `inode` pinned to `etag`: `(keep_cache, direct_io)` for the
        kernel. Pass the `direct_io` returned to `released` when the handle is closed."""
        version = version_hash(etag)
        home = self._home(inode)
        words, halves, slots, window = self._words, self._halves, self.slots, self.window
        self._lock()
        try:
            idle = -1
            for step in range(window):
                base = _HEADER_WORDS + _SLOT_WORDS * ((home + step) % slots)
                owner = words[base]
                if owner == inode:
                    count = halves[2 * base + 4]
                    if words[base + 1] == version:
                        halves[2 * base + 4] = count + 1
                        return True, False
                    if count > 0:
                        return False, True
                    words[base + 1] = version
                    halves[2 * base + 4] = 1
                    return False, False
                if owner == 0:
                    # records are never removed, so an inode is never past an empty slot
                    words[_RECORDS] += 1
                    idle = base
                    break
                if idle < 0 and halves[2 * base + 4] == 0:
                    idle = base
            else:
                if idle < 0:
                    words[_FALLBACKS] += 1
                    return False, True
                words[_EVICTIONS] += 1
            words[idle] = inode
            words[idle + 1] = version
            halves[2 * idle + 4] = 1
            return False, False
        finally:
            self._unlock()

    def released(self, inode: int, etag: str, direct_io: bool) -> None:
        """Record the release of a handle `opened` answered with `direct_io`."""
        if direct_io:
            return  # it never counted in the record, which may now be another inode's
        version = version_hash(etag)
        home = self._home(inode)
        self._lock()
        try:
            base = self._slot_of(inode, home)
            if base is not None and self._words[base + 1] == version:
                halves = self._halves
                halves[2 * base + 4] = max(0, halves[2 * base + 4] - 1)
        finally:
            self._unlock()

    def _slot_of(self, inode: int, home: int) -> int | None:
        """Where `inode`'s record starts (in words), or None if it has none; under the lock.
        Records are never deleted, so the first empty slot of the window ends the search."""
        words, slots = self._words, self.slots
        for step in range(self.window):
            base = _HEADER_WORDS + _SLOT_WORDS * ((home + step) % slots)
            owner = words[base]
            if owner == inode:
                return base
            if owner == 0:
                return None
        return None

    # -- inspection -------------------------------------------------------------------------

    def open_count(self, inode: int, etag: str) -> int:
        """Handles of `inode` pinned to `etag` open through the page cache (0 when the record
        is of another version, or there is none)."""
        version = version_hash(etag)
        home = self._home(inode)
        self._lock()
        try:
            base = self._slot_of(inode, home)
            if base is None or self._words[base + 1] != version:
                return 0
            count: int = self._halves[2 * base + 4]
            return count
        finally:
            self._unlock()

    def statistics(self) -> OpenVersionStats:
        words = self._words
        self._lock()
        try:
            records, evictions, fallbacks = (
                words[_RECORDS],
                words[_EVICTIONS],
                words[_FALLBACKS],
            )
        finally:
            self._unlock()
        return OpenVersionStats(records, self.slots, evictions, fallbacks)

    # -- helpers ----------------------------------------------------------------------------

    def _home(self, inode: int) -> int:
        if inode <= 0 or inode > _U64:
            raise ValueError(f"not an inode number: {inode}")
        return home_slot(inode, self.slots)

    def _lock(self) -> None:
        pid = os.getpid()
        if pid != self._pid:
            self._after_fork(pid)
        self._thread_lock.acquire()
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        except BaseException:
            self._thread_lock.release()
            raise
        self._granted = lock_time.granted()  # under the thread lock: one holder at a time

    def _unlock(self) -> None:
        lock_time.released(self._granted)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def _after_fork(self, pid: int) -> None:
        """This process's own open file description to lock through: the inherited one is
        shared with the parent, and a flock held through it would not exclude the parent."""
        inherited = self._lock_fd
        self._lock_fd = os.open(f"/proc/self/fd/{self._fd}", os.O_RDWR | os.O_CLOEXEC)
        if inherited != self._fd:
            os.close(inherited)
        self._thread_lock = threading.Lock()
        self._pid = pid
