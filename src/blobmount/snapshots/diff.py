"""What changed between two snapshots: blobs added, removed, and changed (another ETag or size).

One merge walk over the two sorted name columns; nothing is decoded for names both hold with
the same version.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from blobmount.snapshots.table import SnapshotTable

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Change:
    """One blob in both snapshots, in another version."""

    name: str
    old_size: int
    new_size: int
    old_etag: str
    new_etag: str


@dataclass(frozen=True, slots=True)
class SnapshotDiff:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[Change, ...]

    @property
    def same(self) -> bool:
        return not (self.added or self.removed or self.changed)


def _same_version(a: SnapshotTable, i: int, b: SnapshotTable, j: int) -> bool:
    if a.sizes[i] != b.sizes[j] or a.etag_kinds[i] != b.etag_kinds[j]:
        return False
    if a.etag_kinds[i] == 0:
        return a.raw_etags[i] == b.raw_etags[j]
    return a.etag_values[i] == b.etag_values[j]


def diff(old: SnapshotTable, new: SnapshotTable) -> SnapshotDiff:
    """The blobs `new` has that `old` has not, the reverse, and those in both that differ."""
    added: list[str] = []
    removed: list[str] = []
    changed: list[Change] = []
    i = j = 0
    while i < len(old) and j < len(new):
        a, b = old.name_bytes(i), new.name_bytes(j)
        if a < b:
            removed.append(a.decode())
            i += 1
        elif b < a:
            added.append(b.decode())
            j += 1
        else:
            if not _same_version(old, i, new, j):
                changed.append(
                    Change(a.decode(), old.sizes[i], new.sizes[j], old.etag(i), new.etag(j))
                )
            i += 1
            j += 1
    removed += (old.name(k) for k in range(i, len(old)))
    added += (new.name(k) for k in range(j, len(new)))
    return SnapshotDiff(tuple(added), tuple(removed), tuple(changed))
