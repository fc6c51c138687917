"""The blobs the main process has read-order hints for, for every process of the mount.

Read-order hints arrive on one socket, served by the main process, and its hint coordinator
fetches the hinted files' first blocks into its own memory. The kernel sends the job's OPEN of
such a file to any process. One that is not the main process would fetch the file again and
leave the main process's blocks unread, and the main process's coordinator would not learn of
the open (the hint window would not move on, and hints the job has overtaken would still be
fetched). So the coordinator records here the name of each blob it has hints for, queued or
fetched ahead and not opened yet, and a process that gets an OPEN of one passes the open to the
main process (`fs/forward.py`), which opens it with its hinted blocks and serves its READs.

A set of 64-bit keys (a hash of the blob name) in a file of the mount's shared folder, written
by the main process alone and read without a lock by all: open addressing, each key within
`WINDOW` slots of its home, 0 an empty slot and 1 a removed one. An add takes the first empty or
removed slot of its window; a removal marks the slot removed, never empty; so a reader may stop
at the first empty slot. A reader racing a write may miss a key (that open is served where it
landed, as without hints) or, with a torn read, see a key that is not there (the open goes to
the main process, which opens the file itself): both cost a little time, never a wrong byte. A
full window records nothing, at the same cost.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

from blobmount.multiproc.open_versions import home_slot, version_hash
from blobmount.shared_file import create_mapped

FILE_NAME = "hinted"
SLOTS = 1 << 16
WINDOW = 32

_EMPTY, _REMOVED = 0, 1
_KEY = struct.Struct("<Q")


def name_key(name: str) -> int:
    """The blob name's key in the set (never 0 or 1)."""
    return version_hash(name) | 2


class SharedHintedNames:
    """The set (see the module's docstring). Create it before forking."""

    def __init__(self, fd: int, mm: mmap.mmap, slots: int) -> None:
        self._fd = fd
        self._mm = mm
        self._words = memoryview(mm).cast("Q")
        self.slots = slots
        #: keys this process added and has not removed (only the writer's is used)
        self._mine: set[int] = set()

    @classmethod
    def create(cls, folder: Path, slots: int = SLOTS) -> SharedHintedNames:
        fd, mm = create_mapped(folder / FILE_NAME, slots * _KEY.size)
        return cls(fd, mm, slots)

    def close(self) -> None:
        if self._fd >= 0:
            self._words.release()
            self._mm.close()
            os.close(self._fd)
            self._fd = -1

    def add(self, name: str) -> None:
        key = name_key(name)
        if key in self._mine:
            return
        words, home = self._words, self._home(key)
        for step in range(WINDOW):
            slot = (home + step) % self.slots
            if words[slot] in (_EMPTY, _REMOVED):
                words[slot] = key
                self._mine.add(key)
                return

    def discard(self, name: str) -> None:
        key = name_key(name)
        if key not in self._mine:
            return
        self._mine.discard(key)
        words, home = self._words, self._home(key)
        for step in range(WINDOW):
            slot = (home + step) % self.slots
            if words[slot] == key:
                words[slot] = _REMOVED
                return

    def holds(self, name: str) -> bool:
        key = name_key(name)
        words, home = self._words, self._home(key)
        for step in range(WINDOW):
            found = words[(home + step) % self.slots]
            if found == key:
                return True
            if found == _EMPTY:
                return False
        return False

    def __len__(self) -> int:
        """Names this process added (the writer's count; 0 in the other processes)."""
        return len(self._mine)

    def _home(self, key: int) -> int:
        return home_slot(key, self.slots)
