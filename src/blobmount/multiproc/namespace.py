"""The namespace state every process of a multi-process mount resolves requests through.

The kernel sends each request to whichever process reads it first, so a process may get a
GETATTR for an inode another process handed out, or a READ of a handle another process opened
(docs/developer-notes/multicore.md, "Any request reaches any process"). Created by the main
process before it forks; every process inherits it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from blobmount.cachedir.shared_budget import SharedBudgetCounters
from blobmount.multiproc.handles import SharedHandles
from blobmount.multiproc.hinted_names import SharedHintedNames
from blobmount.multiproc.names import SharedNames
from blobmount.multiproc.open_versions import SharedOpenVersions
from blobmount.multiproc.whole_file_copies import SiblingCopies


@dataclass(frozen=True, slots=True)
class SharedNamespace:
    #: inode number -> path, for every node a process handed to the kernel
    names: SharedNames
    #: handle number -> the inode and the version it pinned
    handles: SharedHandles
    #: per inode, the version the kernel may hold pages of and its open handles
    versions: SharedOpenVersions
    #: the disk cache's usage and reservations: one budget for every process's writes
    budget: SharedBudgetCounters
    #: the blobs the main process has hints for: their opens are passed to it
    hinted: SharedHintedNames
    #: whole-file mode: the downloads in progress and the entries each process wrote
    copies: SiblingCopies
    #: the mount's folder in /dev/shm these tables are in (block mode keeps the main
    #: process's hinted blocks there too, blocks/shelf.py)
    folder: Path

    @classmethod
    def create(cls, folder: Path, processes: int) -> SharedNamespace:
        return cls(
            SharedNames.create(folder),
            SharedHandles.create(folder, processes),
            SharedOpenVersions.create(folder),
            SharedBudgetCounters.create(folder),
            SharedHintedNames.create(folder),
            SiblingCopies.create(folder, processes),
            folder,
        )

    def bind(self, index: int) -> None:
        """This process is process `index` of the mount (once per process, after the fork)."""
        self.handles.bind(index)
        self.copies.bind(index)

    @property
    def index(self) -> int:
        """This process's index (0: the main process); -1 before `bind`."""
        return self.handles.index

    def close(self) -> None:
        self.names.close()
        self.handles.close()
        self.versions.close()
        self.budget.close()
        self.hinted.close()
        self.copies.close()
