"""The running figures of one cache folder's budget, shared by every process of a mount.

Each process keeps its own `CacheBudget`, and a budget alone only knows the last scan and its own
process's writes since. With several processes writing, each would check a reservation against
a figure that leaves out what the others wrote since the last scan, so the folder could grow past
DATASET_MOUNT_CACHE_SIZE by what they wrote together. These counters sit in a small file mapped
by every process (created by the main process before it forks, inherited by the children), so a
check and its reservation happen in one step against the writes and reservations of all of them.

What the file holds:

- the bytes and entries in use, and the bytes reserved by writes in progress (every process's);
- running totals of the bytes and entries every write ever settled: a scan takes them at its
  start, so the usage it measured can be corrected by the writes other processes settled while
  it walked (see `rebase`);
- one slot per process: its pid and its own reserved bytes. A process holds a record lock on its
  slot for as long as it lives and the kernel drops that lock when the process dies (SIGKILL or
  OOM kill included). So a live process can tell that a slot's owner is gone, and can hand its
  reservations back. Without that, a killed worker's writes in progress would shrink the cache
  for good.

Locks. Every change holds a POSIX record lock (`fcntl.lockf`) on the header. Such locks belong
to a process. An `flock` through the descriptor every process inherited would be shared by all
of them, so it would not keep them apart. A record lock does not exclude the threads of one
process, so a `threading.Lock` is held as well. Two caveats of record locks apply. A process
loses all of its locks on the file when it closes *any* descriptor of it, so keep one object per
file in each process and close it last. A child inherits no locks across a fork, which is why
each process takes its slot itself, on first use.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import struct
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from blobmount.shared_file import create_mapped

FILE_NAME = "budget"
#: processes that may hold a slot at once; a mount has at most 16, and a dead one's slot is
#: taken back, so this leaves room for a test's extra processes
SLOTS = 64

#: used bytes, entries, reserved bytes, settled bytes (ever), settled entries (ever)
_HEADER = struct.Struct("<5q")
_HEADER_SIZE = 64
#: owner pid (0: free), the owner's reserved bytes
_SLOT = struct.Struct("<qq")
_LENGTH = _HEADER_SIZE + SLOTS * _SLOT.size
_USED, _ENTRIES, _RESERVED = 0, 8, 16  # offsets in the header
_Q = struct.Struct("<q")

assert _HEADER.size <= _HEADER_SIZE


class BudgetFigures(NamedTuple):
    used_bytes: int
    entries: int
    #: every process's writes in progress
    reserved_bytes: int
    #: this process's share of `reserved_bytes`
    own_reserved_bytes: int


@dataclass(frozen=True, slots=True)
class SettledMark:
    """The settled totals when a scan starts: all processes', and this process's own."""

    all_bytes: int
    all_entries: int
    own_bytes: int
    own_entries: int


class SharedBudgetCounters:
    """Used bytes, entries and reserved bytes of one cache folder, changed atomically by any
    process of the mount (see the module docstring). Create in the main process before it
    forks; every child inherits the object and takes its own slot on first use."""

    def __init__(self, fd: int, mm: mmap.mmap) -> None:
        self._fd = fd
        self._mm = mm
        self._thread_lock = threading.Lock()
        #: this process's slot, -1 until taken (and again in a forked child)
        self._slot = -1
        #: what this process settled since it took its slot: the part of the shared totals a
        #: scan's correction must not add twice (its pruner counts its own writes itself)
        self._own_settled_bytes = 0
        self._own_settled_entries = 0
        _objects.add(self)

    @classmethod
    def create(cls, folder: Path, name: str = FILE_NAME) -> SharedBudgetCounters:
        """New counters, all zero, in file `name` of `folder` (which must not exist yet)."""
        fd, mm = create_mapped(folder / name, _LENGTH)
        return cls(fd, mm)

    def close(self) -> None:
        """Give back this process's reservations (writes that will never settle) and unmap."""
        if self._fd < 0:
            return
        if self._slot >= 0:
            self._lock()
            try:
                self._release_slot(self._slot)
            finally:
                self._unlock()
            self._slot = -1
        self._mm.close()
        os.close(self._fd)  # drops every record lock this process held on the file
        self._fd = -1

    # -- the operations a budget uses --------------------------------------------------------

    def attach(self) -> None:
        """Take this process's slot now rather than at its first reservation, so a problem
        shows when the cache opens. RuntimeError if every slot is held by a live process."""
        self._lock()
        try:
            self._own_slot()
        finally:
            self._unlock()

    def read(self) -> BudgetFigures:
        self._lock()
        try:
            used, entries, reserved, _, _ = _HEADER.unpack_from(self._mm, 0)
            own = self._slot_reserved(self._slot) if self._slot >= 0 else 0
        finally:
            self._unlock()
        return BudgetFigures(used, entries, reserved, own)

    def try_reserve(self, nbytes: int, capacity: int) -> bool:
        """Reserve `nbytes` if every process's usage and reservations, plus `nbytes`, fit in
        `capacity`. The check and the reservation are one step."""
        self._lock()
        try:
            mm = self._mm
            used, _, reserved, _, _ = _HEADER.unpack_from(mm, 0)
            if used + reserved + nbytes > capacity:
                return False
            slot = self._own_slot()
            _Q.pack_into(mm, _RESERVED, reserved + nbytes)
            _Q.pack_into(mm, _slot_offset(slot) + 8, self._slot_reserved(slot) + nbytes)
            return True
        finally:
            self._unlock()

    def settle(self, reserved: int, written: int) -> None:
        """A write of this process ended. Its reservation goes back, and `written` bytes (0 if
        nothing was written) count as one more entry in use. Only this process's own
        reservations are given back, so a wrong figure cannot release another's."""
        self._lock()
        try:
            mm = self._mm
            used, entries, total, settled_bytes, settled_entries = _HEADER.unpack_from(mm, 0)
            if reserved > 0 and self._slot >= 0:
                own = self._slot_reserved(self._slot)
                give = min(reserved, own)
                _Q.pack_into(mm, _slot_offset(self._slot) + 8, own - give)
                total = max(0, total - give)
            if written > 0:
                used += written
                entries += 1
                settled_bytes += written
                settled_entries += 1
                self._own_settled_bytes += written
                self._own_settled_entries += 1
            _HEADER.pack_into(mm, 0, used, entries, total, settled_bytes, settled_entries)
        finally:
            self._unlock()

    def removed(self, nbytes: int, entries: int = 1) -> None:
        self._lock()
        try:
            mm = self._mm
            used, count = _HEADER.unpack_from(mm, 0)[:2]
            _Q.pack_into(mm, _USED, max(0, used - nbytes))
            _Q.pack_into(mm, _ENTRIES, max(0, count - entries))
        finally:
            self._unlock()

    def mark(self) -> SettledMark:
        """Take this at the start of a scan and pass it to `rebase` with the scan's result."""
        self._lock()
        try:
            settled_bytes, settled_entries = _HEADER.unpack_from(self._mm, 0)[3:]
        finally:
            self._unlock()
        own = (self._own_settled_bytes, self._own_settled_entries)
        return SettledMark(settled_bytes, settled_entries, *own)

    def rebase(self, used: int, entries: int, since: SettledMark | None = None) -> None:
        """Adopt a scan's usage and entries. Reservations stay: they are writes in progress,
        in this process or another, that no scan counts.

        With `since` (the mark taken as the scan started), what *other* processes settled
        since then is added. A scan may or may not have seen those files, so it errs on the
        high side, and the next scan sets that right. Without it, a file another process
        finished while the scan walked past its folder would be counted nowhere. This
        process's own writes are left to its pruner, which knows which ones the scan saw.

        Slots of dead processes are taken back here too (once a scan, so a handful of
        syscalls), and the reserved total is summed again from the slots."""
        self._lock()
        try:
            mm = self._mm
            settled_bytes, settled_entries = _HEADER.unpack_from(mm, 0)[3:]
            if since is not None:
                own_bytes = self._own_settled_bytes - since.own_bytes
                own_entries = self._own_settled_entries - since.own_entries
                used += max(0, settled_bytes - since.all_bytes - own_bytes)
                entries += max(0, settled_entries - since.all_entries - own_entries)
            _Q.pack_into(mm, _USED, max(0, used))
            _Q.pack_into(mm, _ENTRIES, max(0, entries))
            self._sweep()
        finally:
            self._unlock()

    # -- slots -------------------------------------------------------------------------------

    def _own_slot(self) -> int:
        """This process's slot, taken on first use (the caller holds the header lock). Dead
        processes' slots are taken back first."""
        if self._slot >= 0:
            return self._slot
        free = self._sweep()
        if free < 0:
            raise RuntimeError(f"all {SLOTS} slots of the shared cache budget are in use")
        offset = _slot_offset(free)
        # free, and the header lock keeps other claimants out: this cannot wait
        fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, _SLOT.size, offset)
        _SLOT.pack_into(self._mm, offset, os.getpid(), 0)
        self._slot = free
        return free

    def _sweep(self) -> int:
        """Free the slots of processes that are gone, handing their reservations back. Then
        sum the reserved total again from the slots, which also heals a total a process left
        half-changed when it was killed between two stores. Returns the first free slot, or
        -1. The caller holds the header lock."""
        mm, first_free, total = self._mm, -1, 0
        for slot in range(SLOTS):
            pid, reserved = _SLOT.unpack_from(mm, _slot_offset(slot))
            if pid != 0 and slot != self._slot and not self._owner_alive(slot):
                _SLOT.pack_into(mm, _slot_offset(slot), 0, 0)
                pid = reserved = 0
            if pid == 0 and first_free < 0:
                first_free = slot
            total += reserved
        _Q.pack_into(mm, _RESERVED, total)
        return first_free

    def _owner_alive(self, slot: int) -> bool:
        """Whether a live process holds the slot's lock. The test takes that lock, so it must
        not be run on this process's own slot: a process's own locks never stop it."""
        offset = _slot_offset(slot)
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, _SLOT.size, offset)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return True
            raise
        fcntl.lockf(self._fd, fcntl.LOCK_UN, _SLOT.size, offset)
        return False

    def _release_slot(self, slot: int) -> None:
        offset = _slot_offset(slot)
        reserved = self._slot_reserved(slot)
        total = _Q.unpack_from(self._mm, _RESERVED)[0]
        _Q.pack_into(self._mm, _RESERVED, max(0, total - reserved))
        _SLOT.pack_into(self._mm, offset, 0, 0)
        fcntl.lockf(self._fd, fcntl.LOCK_UN, _SLOT.size, offset)

    def _slot_reserved(self, slot: int) -> int:
        value: int = _Q.unpack_from(self._mm, _slot_offset(slot) + 8)[0]
        return value

    # -- locking -----------------------------------------------------------------------------

    def _lock(self) -> None:
        self._thread_lock.acquire()
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX, _HEADER_SIZE, 0)
        except BaseException:
            self._thread_lock.release()
            raise

    def _unlock(self) -> None:
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, _HEADER_SIZE, 0)
        finally:
            self._thread_lock.release()

    def _after_fork_in_child(self) -> None:
        """The child holds none of the parent's record locks and must take a slot of its own.
        The thread lock may have been held by a thread that does not exist in the child."""
        self._thread_lock = threading.Lock()
        self._slot = -1
        self._own_settled_bytes = self._own_settled_entries = 0


def _slot_offset(slot: int) -> int:
    return _HEADER_SIZE + slot * _SLOT.size


_objects: weakref.WeakSet[SharedBudgetCounters] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for counters in list(_objects):
        counters._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_after_fork)
