"""A set of 64-bit keys that one process writes and every process of the mount reads.

The set lives in a file of the mount's shared folder (memory: /dev/shm), created before the
processes fork: open addressing, each key within `WINDOW` slots of its home, 0 an empty slot
and 1 a removed one (so keys are never 0 or 1). An add takes the first empty or removed slot
of its window; a removal marks the slot removed, never empty; so a reader may stop at the first
empty slot. Only one process writes a set, so writes need no lock, and readers take none: a
reader racing a write may miss a key or, with a torn read, see one that is not there. Every user
must make both cost time only, never a wrong byte. A full window records nothing, with the cost
of a miss.

Used for the blobs the main process has hints for (`hinted_names`) and the whole-file copies
each process wrote (`multiproc.whole_file_copies`).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from blobmount.multiproc.open_versions import home_slot
from blobmount.shared_file import create_mapped

WINDOW = 32

_EMPTY, _REMOVED = 0, 1
_KEY_BYTES = 8


class SharedKeySet:
    """The set (see the module's docstring)."""

    def __init__(self, fd: int, mm: mmap.mmap, slots: int) -> None:
        self._fd = fd
        self._mm = mm
        self._words = memoryview(mm).cast("Q")
        self.slots = slots
        #: keys this process added and has not removed (only the writer's is used)
        self._mine: set[int] = set()

    @classmethod
    def create(cls, path: Path, slots: int) -> SharedKeySet:
        fd, mm = create_mapped(path, slots * _KEY_BYTES)
        return cls(fd, mm, slots)

    def close(self) -> None:
        if self._fd >= 0:
            self._words.release()
            self._mm.close()
            os.close(self._fd)
            self._fd = -1

    def add(self, key: int) -> bool:
        """Record `key` (never 0 or 1); False if its window is full (not recorded)."""
        if key in self._mine:
            return True
        words, home = self._words, home_slot(key, self.slots)
        for step in range(WINDOW):
            slot = (home + step) % self.slots
            if words[slot] in (_EMPTY, _REMOVED):
                words[slot] = key
                self._mine.add(key)
                return True
        return False

    def discard(self, key: int) -> None:
        if key not in self._mine:
            return
        self._mine.discard(key)
        words, home = self._words, home_slot(key, self.slots)
        for step in range(WINDOW):
            slot = (home + step) % self.slots
            if words[slot] == key:
                words[slot] = _REMOVED
                return

    def holds(self, key: int) -> bool:
        words, home = self._words, home_slot(key, self.slots)
        for step in range(WINDOW):
            found = words[(home + step) % self.slots]
            if found == key:
                return True
            if found == _EMPTY:
                return False
        return False

    def __len__(self) -> int:
        """Keys this process added (the writer's count; 0 in the other processes)."""
        return len(self._mine)
