"""FUSE file and folder handle numbers that every process of the mount can resolve.

The kernel sends a handle's READs and its RELEASE to whichever process reads the request
first, not to the one that answered the OPEN. So the handle number names a slot in a table
every process maps (a file in the mount's shared folder), and the slot holds what the opener
pinned: the inode, and for a file the ETag and size of the version it opened, so a read in
another process never mixes versions.

The table is `processes * per_process` fixed-size slots, and each process allocates only in its
own range, so opens never contend. A slot is freed by whichever process gets the RELEASE; its
owner finds such slots again by scanning its range now and then. A handle number is the slot's
index plus the slot's generation, bumped at every allocation, in the upper 32 bits: a number
kept after its RELEASE never resolves to the slot's next handle.

Reads take no lock (GETATTR of a handle, READ of a handle another process opened): a slot's
first word is a sequence number, odd while the slot is written, and a reader retries when it
changes under it (a seqlock). Python has no memory fences, but a slot's fields are written
before its number leaves the opener (through the kernel), so a reader holding a live number
sees them whole; the recheck is for a stale number whose slot is being reused.

Writes (allocate, free) hold a POSIX record lock (`lockf`) on the slot's bytes: such locks
belong to a process, unlike an `flock` on the file descriptor every process inherited, and the
kernel drops them when the holder dies. A slot a dead writer left
odd is repaired by the next process that takes its lock: it is freed, which is right both for
an allocation whose number was never returned and for a free that was under way.

A replacement for a dead worker binds the same index and keeps the slots its predecessor left
in use: the kernel still holds those handles.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blobmount.shared_file import create_mapped

FILE_NAME = "handles"
SLOT_SIZE = 128
#: the longest ETag a handle can pin, in bytes (Azure's are 19)
ETAG_MAX = 96

#: sequence (odd while written), generation, inode, size, flags, ETag length, ETag
_SLOT = struct.Struct(f"<IIQQBB{ETAG_MAX}s")
_SEQ = struct.Struct("<I")
_SEQ_GEN = struct.Struct("<II")
#: what follows the sequence number and the generation
_TAIL = struct.Struct(f"<QQBB{ETAG_MAX}s")
_GEN_OFFSET = _SEQ.size
_TAIL_OFFSET = _SEQ_GEN.size
_FLAGS_OFFSET = struct.calcsize("<IIQQ")
_FLAGS = struct.Struct("<B")

#: flags: a slot is in use exactly when its flags are not 0
_USED, _FILE, _DIRECT_IO, _BY_OWNER, _SHELVED = 0x01, 0x02, 0x04, 0x08, 0x10

_SLOT_BITS = 32
_SLOT_MASK = (1 << _SLOT_BITS) - 1
_WORD = (1 << 32) - 1
#: lock-free reads of a slot before a reader suspects a dead writer and takes the lock
_SPINS = 1000

assert _SLOT.size <= SLOT_SIZE


@dataclass(frozen=True, slots=True)
class HandleRecord:
    """What a handle pinned when it was opened."""

    inode: int
    #: the version's ETag; None for a folder handle
    etag: str | None
    size: int
    #: the open bypassed the page cache (another version of the inode was open)
    direct_io: bool = False
    #: every READ goes to the owner (it holds the file's hinted blocks)
    by_owner: bool = False
    #: the file's hinted blocks are on the main process's shelf: read them from there
    shelved: bool = False


class SharedHandles:
    """Handle numbers any process resolves; `bind` in each process before it allocates. One
    process, one thread: the record locks do not exclude threads of the same process."""

    def __init__(self, fd: int, mm: mmap.mmap, processes: int, per_process: int) -> None:
        self._fd = fd
        self._mm = mm
        self.processes = processes
        self.per_process = per_process
        self._total = processes * per_process
        self._creator = os.getpid()
        #: the process this object is bound in (0: nowhere yet), its index and first slot
        self._pid = 0
        self._index = -1
        self._first = 0
        #: free slots of this process's range (relative), the lowest last: popped first
        self._free: list[int] = []
        #: slots of the range below this one have been used; none above it
        self._next = 0
        #: slots taken above the old `_next` since the range was last scanned
        self._fresh = 0

    @classmethod
    def create(cls, folder: Path, processes: int, per_process: int = 65536) -> SharedHandles:
        """A new table in `folder` (made by the main process before it forks). The file is
        sparse: only slots ever used take memory."""
        if processes < 1 or per_process < 1 or processes * per_process > _SLOT_MASK + 1:
            raise ValueError(f"no table of {processes} x {per_process} handles")
        length = processes * per_process * SLOT_SIZE
        fd, mm = create_mapped(folder / FILE_NAME, length)
        return cls(fd, mm, processes, per_process)

    def close(self) -> None:
        if self._fd >= 0:
            self._mm.close()
            os.close(self._fd)
            self._fd = -1

    @property
    def index(self) -> int:
        """The index this object is bound to (-1: not bound yet)."""
        return self._index

    def bind(self, index: int) -> None:
        """Allocate from range `index` in this process from now on (once per process, after the
        fork). Slots a dead predecessor left in use stay in use."""
        if not 0 <= index < self.processes:
            raise ValueError(f"process index {index} is not in 0..{self.processes - 1}")
        self._pid, self._index, self._first = os.getpid(), index, index * self.per_process
        start = self._first * SLOT_SIZE
        flags = self._mm[start + _FLAGS_OFFSET : start + self.per_process * SLOT_SIZE : SLOT_SIZE]
        self._next = len(flags.rstrip(b"\0"))
        self._scan()

    def add(
        self,
        inode: int,
        etag: str | None,
        size: int,
        direct_io: bool = False,
        by_owner: bool = False,
        shelved: bool = False,
    ) -> int:
        """A new handle for `inode` (a folder's when `etag` is None): its number, above 0 and
        below 2**64. OSError(ENFILE) when this process's range is full."""
        if self._pid != os.getpid():
            self._bind_here()
        raw = b"" if etag is None else etag.encode("utf-8", "surrogatepass")
        if len(raw) > ETAG_MAX:
            raise ValueError(f"an ETag of {len(raw)} bytes (at most {ETAG_MAX}): {etag!r}")
        flags = (
            _USED
            | (0 if etag is None else _FILE)
            | (_DIRECT_IO if direct_io else 0)
            | (_BY_OWNER if by_owner else 0)
            | (_SHELVED if shelved else 0)
        )
        tail = _TAIL.pack(inode, size, flags, len(raw), raw)  # struct.error before any write
        slot = self._take()
        offset = slot * SLOT_SIZE
        mm = self._mm
        try:
            self._lock(offset)
        except BaseException:
            self._free.append(slot - self._first)
            raise
        try:
            seq, generation = _SEQ_GEN.unpack_from(mm, offset)
            generation = generation + 1 if generation < _WORD else 1  # 0 is never a handle's
            seq |= 1  # already odd if a writer died here
            _SEQ.pack_into(mm, offset, seq)
            _SEQ.pack_into(mm, offset + _GEN_OFFSET, generation)
            mm[offset + _TAIL_OFFSET : offset + _TAIL_OFFSET + _TAIL.size] = tail
            _SEQ.pack_into(mm, offset, (seq + 1) & _WORD)
        finally:
            self._unlock(offset)
        return slot | generation << _SLOT_BITS

    def get(self, fh: int) -> HandleRecord | None:
        """The record of handle `fh`, without a lock; None if it was released (or never
        was a handle)."""
        slot = self._slot(fh)
        if slot < 0:
            return None
        offset, mm = slot * SLOT_SIZE, self._mm
        for spin in range(_SPINS):
            fields = _SLOT.unpack_from(mm, offset)
            if not fields[0] & 1 and _SEQ.unpack_from(mm, offset)[0] == fields[0]:
                return _record(fields, fh >> _SLOT_BITS)
            if spin >= 10:
                os.sched_yield()  # a writer in another process is between its two stores
        self._lock(offset)  # still odd: its writer died half-way
        try:
            self._repair(offset)
            return _record(_SLOT.unpack_from(mm, offset), fh >> _SLOT_BITS)
        finally:
            self._unlock(offset)

    def owner(self, fh: int) -> int:
        """The index of the process whose range handle `fh` is in (the one that opened it,
        or its replacement); -1 if `fh` is no handle number."""
        slot = self._slot(fh)
        return -1 if slot < 0 else slot // self.per_process

    def remove(self, fh: int) -> HandleRecord | None:
        """Free handle `fh`, in any process (RELEASE lands in any); its record, or None if it
        was already freed (or never was a handle)."""
        slot = self._slot(fh)
        if slot < 0:
            return None
        offset, mm = slot * SLOT_SIZE, self._mm
        self._lock(offset)
        try:
            fields = _SLOT.unpack_from(mm, offset)
            if fields[0] & 1:  # a dead writer's: freed, and not this handle any more
                self._repair(offset)
                return None
            record = _record(fields, fh >> _SLOT_BITS)
            if record is not None:
                seq = fields[0] + 1
                _SEQ.pack_into(mm, offset, seq & _WORD)
                _FLAGS.pack_into(mm, offset + _FLAGS_OFFSET, 0)
                _SEQ.pack_into(mm, offset, (seq + 1) & _WORD)
        finally:
            self._unlock(offset)
        if record is not None and self._pid == os.getpid():
            relative = slot - self._first
            if 0 <= relative < self._next:  # this process's own slot: reused first
                self._free.append(relative)
        return record

    # -- allocation in this process's range ---------------------------------------------------

    def _bind_here(self) -> None:
        """`add` in a process that never called `bind`: the process that made the table, used
        alone (tests, a single-process user), takes range 0; a forked one must bind first."""
        if self._pid == 0 and os.getpid() == self._creator:
            self.bind(0)
        else:
            raise RuntimeError("SharedHandles.bind(index) was not called in this process")

    def _take(self) -> int:
        """A free slot of this process's range: one freed here, else a new one while the range
        is not half full of slots taken since the last scan, else one a scan finds."""
        if not self._free and (
            self._fresh >= max(64, self._next // 2) or self._next >= self.per_process
        ):
            self._scan()
        if self._free:
            return self._first + self._free.pop()
        if self._next < self.per_process:
            self._next += 1
            self._fresh += 1
            return self._first + self._next - 1
        raise OSError(
            errno.ENFILE, f"all {self.per_process} handles of process {self._index} are open"
        )

    def _scan(self) -> None:
        """Find the free slots below `_next` (other processes free this range's slots too),
        repairing any a dead writer left half-written. About 5 ms for a full range of 65,536
        slots, and at most once per `_next / 2` new slots."""
        start = self._first * SLOT_SIZE
        stop = start + self._next * SLOT_SIZE
        mm = self._mm
        seqs = mm[start:stop:SLOT_SIZE]  # each slot's lowest sequence byte: odd while written
        for relative in [i for i, low in enumerate(seqs) if low & 1]:
            offset = start + relative * SLOT_SIZE
            self._lock(offset)
            try:
                self._repair(offset)
            finally:
                self._unlock(offset)
        flags = mm[start + _FLAGS_OFFSET : stop : SLOT_SIZE]
        self._free = [i for i in range(self._next - 1, -1, -1) if not flags[i]]
        self._fresh = 0

    # -- slots -----------------------------------------------------------------------------

    def _slot(self, fh: int) -> int:
        slot = fh & _SLOT_MASK
        if not 0 < fh < 1 << 64 or fh >> _SLOT_BITS == 0 or slot >= self._total:
            return -1
        return slot

    def _repair(self, offset: int) -> None:
        """Free a slot left odd by a writer that died (the caller holds the slot's lock, so no
        live writer is in it)."""
        seq = _SEQ.unpack_from(self._mm, offset)[0]
        if seq & 1:
            _FLAGS.pack_into(self._mm, offset + _FLAGS_OFFSET, 0)
            _SEQ.pack_into(self._mm, offset, (seq + 1) & _WORD)

    def _lock(self, offset: int) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_EX, SLOT_SIZE, offset)

    def _unlock(self, offset: int) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN, SLOT_SIZE, offset)


def _record(fields: tuple[Any, ...], generation: int) -> HandleRecord | None:
    """The record of a slot's fields if the slot holds a handle of `generation`."""
    _, slot_generation, inode, size, flags, length, etag = fields
    if not flags or slot_generation != generation:
        return None
    text = etag[:length].decode("utf-8", "surrogatepass") if flags & _FILE else None
    return HandleRecord(
        inode,
        text,
        size,
        bool(flags & _DIRECT_IO),
        bool(flags & _BY_OWNER),
        bool(flags & _SHELVED),
    )
