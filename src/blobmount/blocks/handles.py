"""Open handles of the block reader: one handle's state, and who else has its file open.

A `BlockHandle` is what an open file reads through: the blob version it is pinned to, its
read-ahead policy and its buffer. `OpenHandles` keeps the open handles of each version and where
their readers began, so the read-ahead of one reader of a file can stop where another reader's
part of it begins (see ReadAheadScheduler).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blobmount.blocks.keys import BlobVersion
from blobmount.blocks.readahead import ReadAheadPolicy

#: starts of closed handles remembered per open file (many short-lived handles of random reads
#: must not make it grow without bound)
MAX_CLOSED_STARTS = 64


@dataclass(eq=False, slots=True)
class BlockHandle:
    """Per-open-file state of the block reader."""

    version: BlobVersion
    policy: ReadAheadPolicy
    buffer: dict[int, bytes] = field(default_factory=dict)
    pending: set[int] = field(default_factory=set)
    prefetched: set[int] = field(default_factory=set)  # in buffer, not yet read
    closed: bool = False
    #: opened in place of the main process, whose hinted blocks of it are on the shelf
    #: (blocks/shelf.py): they are read from there
    shelved: bool = False
    #: blocks of it read from the shelf
    shelf_reads: int = 0


@dataclass(slots=True)
class FileReaders:
    """The open handles of one blob version, and where the streams of its closed handles began
    (kept while any handle of the version is open)."""

    handles: list[BlockHandle] = field(default_factory=list)
    closed_starts: dict[int, None] = field(default_factory=dict)  # an ordered set

    def remember_starts(self, handle: BlockHandle) -> None:
        for start in handle.policy.stream_starts():
            self.closed_starts.pop(start, None)
            self.closed_starts[start] = None
        while len(self.closed_starts) > MAX_CLOSED_STARTS:
            del self.closed_starts[next(iter(self.closed_starts))]

    def starts(self, reading: BlockHandle) -> list[int]:
        """Where readers began, as `reading` sees it: its own first read is no limit to it (a
        reader of a footer first, as Parquet and zip readers are, then reads from the start)."""
        out = list(self.closed_starts)
        for handle in self.handles:
            policy = handle.policy
            out.extend(policy.stream_starts() if handle is reading else policy.starts())
        return out


class OpenHandles:
    """Knows which handles of each blob version are open and where their readers began; forgets
    a version once its last handle closes."""

    def __init__(self) -> None:
        self._files: dict[tuple[str, str], FileReaders] = {}

    def __len__(self) -> int:
        """How many blob versions have a handle open."""
        return len(self._files)

    def of(self, version: BlobVersion) -> FileReaders | None:
        return self._files.get((version.name, version.etag))

    def add(self, handle: BlockHandle) -> None:
        key = (handle.version.name, handle.version.etag)
        self._files.setdefault(key, FileReaders()).handles.append(handle)

    def remove(self, handle: BlockHandle) -> None:
        key = (handle.version.name, handle.version.etag)
        readers = self._files[key]
        readers.handles.remove(handle)
        if readers.handles:
            readers.remember_starts(handle)
        else:
            del self._files[key]

    def others_start_in(self, handle: BlockHandle, ahead: range) -> int | None:
        """The first block in `ahead` where another reader of the same file started (see
        ReadAheadPolicy.starts; for `handle` itself only where its streams began), including
        readers that have closed their handles while the file is still open. Several readers
        each reading their own part of one file (8 DataLoader workers, each a slice, each with
        its own handle) would otherwise each read a whole window into the next part, which
        that part's reader has fetched already, or has even finished. A reader that does carry
        on past that point gets its read-ahead back one block later. (The stream `ahead`
        belongs to started before `ahead`, so it never cuts itself short.)"""
        readers = self._files.get((handle.version.name, handle.version.etag))
        if readers is None:
            return None
        starts = readers.starts(handle)
        return min((s for s in starts if ahead.start <= s < ahead.stop), default=None)
