"""The blobs the main process has read-order hints for, for every process of the mount.

Read-order hints arrive on one socket, served by the main process, and its hint coordinator
fetches the hinted files' first blocks into its own memory. The kernel sends the job's OPEN of
such a file to any process. One that is not the main process would fetch the file again and
leave the main process's blocks unread, and the main process's coordinator would not learn of
the open (the hint window would not move on, and hints the job has overtaken would still be
fetched). So the coordinator records here the name of each blob it has hints for, queued or
fetched ahead and not opened yet, and a process that gets an OPEN of one passes the open to the
main process (`fs/forward.py`), which opens it with its hinted blocks and serves its READs.

The set is a `SharedKeySet` (multiproc/key_set.py) of blob-name hashes, written by the main
process alone. A read that misses a name being added serves that open where it landed, as
without hints; a torn read that sees a name not there sends the open to the main process, which
opens the file itself: both cost a little time, never a wrong byte.
"""

from __future__ import annotations

from pathlib import Path

from blobmount.multiproc.key_set import SharedKeySet
from blobmount.multiproc.open_versions import version_hash

FILE_NAME = "hinted"
SLOTS = 1 << 16


def name_key(name: str) -> int:
    """The blob name's key in the set (never 0 or 1)."""
    return version_hash(name) | 2


class SharedHintedNames:
    """The set of hinted blob names. Create it before forking; only the main process writes."""

    def __init__(self, keys: SharedKeySet) -> None:
        self._keys = keys

    @classmethod
    def create(cls, folder: Path, slots: int = SLOTS) -> SharedHintedNames:
        return cls(SharedKeySet.create(folder / FILE_NAME, slots))

    def close(self) -> None:
        self._keys.close()

    def add(self, name: str) -> None:
        self._keys.add(name_key(name))

    def discard(self, name: str) -> None:
        self._keys.discard(name_key(name))

    def holds(self, name: str) -> bool:
        return self._keys.holds(name_key(name))

    def __len__(self) -> int:
        """Names this process added (the writer's count; 0 in the other processes)."""
        return len(self._keys)
