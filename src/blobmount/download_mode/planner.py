"""Deciding what to do with each listed blob: fetch it, skip it, make a folder, or refuse it.

`Planner.classify` takes one listing page (the downloader lists the prefix flat, 5000 blobs a
page) and returns one `Item` per blob, in listing order. It applies, in this order: path safety
(`paths.local_path`), the include/exclude filters, and the manifest check that makes reruns
cheap. It blocks (manifest lookups, `lstat` of local files): call it from a worker thread, once
per page, so the per-blob cost stays a few microseconds.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from blobmount.download_mode.filters import NameFilter
from blobmount.download_mode.manifest import Manifest, Record
from blobmount.download_mode.paths import local_path
from blobmount.download_mode.staging import Destination
from blobmount.namespace.names import UnsafeName, is_folder_blob
from blobmount.storage.base import BlobProps

log = logging.getLogger(__name__)


class Action(enum.Enum):
    FETCH = "fetch"  # download it
    CHECK = "check"  # the local copy looks current; hash it against Content-MD5 (--verify)
    SKIP = "skip"  # the local copy is current
    FOLDER = "folder"  # make an (empty) folder
    REFUSE = "refuse"  # the name cannot be a local path; `reason` says why
    FILTERED = "filtered"  # left out by --include/--exclude
    IGNORE = "ignore"  # nothing to do (a marker for the prefix itself)


@dataclass(frozen=True, slots=True)
class Item:
    blob: BlobProps
    action: Action
    rel: str = ""  # path relative to DEST ('' for REFUSE)
    reason: str = ""  # for REFUSE
    record: Record | None = None  # the manifest's row, for SKIP and CHECK


def source_id(location: str, blob_name: str) -> str:
    """How the manifest names a blob: storage location (account/container) + name."""
    return f"{location}/{blob_name}"


class Planner:
    def __init__(
        self,
        *,
        prefix: str,
        location: str,
        dest: Destination,
        manifest: Manifest,
        name_filter: NameFilter,
        verify: bool,
    ) -> None:
        self._prefix = prefix
        self._location = location
        self._dest = dest
        self._manifest = manifest
        self._filter = name_filter
        self._verify = verify

    def classify(self, blobs: Sequence[BlobProps]) -> list[Item]:
        """One Item per blob, same order (blocking; see the module docstring)."""
        first = [self._by_name(blob) for blob in blobs]
        wanted = [entry[1] for entry in first if isinstance(entry, tuple)]
        records = self._manifest.lookup(wanted) if wanted else {}
        items: list[Item] = []
        for entry in first:
            if isinstance(entry, Item):
                items.append(entry)
            else:
                blob, rel = entry
                items.append(self._against_manifest(blob, rel, records.get(rel)))
        return items

    def _by_name(self, blob: BlobProps) -> Item | tuple[BlobProps, str]:
        """An Item decided by the name alone, or (blob, rel) for a file to look up."""
        is_dir = is_folder_blob(blob.name, blob.size, blob.is_dir_marker)
        try:
            rel = local_path(blob.name, self._prefix, is_dir=is_dir)
        except UnsafeName as exc:
            return Item(blob, Action.REFUSE, reason=f"refused: {exc}")
        if is_dir and rel == "":
            return Item(blob, Action.IGNORE)
        if not self._filter.keeps(rel):
            return Item(blob, Action.FILTERED, rel)
        if is_dir:
            return Item(blob, Action.FOLDER, rel)
        return blob, rel

    def _against_manifest(self, blob: BlobProps, rel: str, record: Record | None) -> Item:
        if record is None or not (
            record.source == source_id(self._location, blob.name)
            and record.etag == blob.etag
            and record.size == blob.size
        ):
            return Item(blob, Action.FETCH, rel)
        st = self._dest.stat_file(rel)
        # the local file must still be the one we wrote: same size, same mtime (we set it)
        if st is None or st.st_size != blob.size or st.st_mtime_ns != record.mtime_ns:
            return Item(blob, Action.FETCH, rel)
        if self._verify and blob.content_md5 is not None and not record.md5_verified:
            return Item(blob, Action.CHECK, rel, record=record)
        return Item(blob, Action.SKIP, rel, record=record)
