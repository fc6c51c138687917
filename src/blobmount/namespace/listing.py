"""Lazy listing of one directory.

Entries are appended page by page as storage returns them; an entry's index never changes, so
readdir offsets stay valid while the listing grows. Pages are fetched only when a reader needs
entries past the end of what is known, so a reader that stops early stops the listing, and the
first entries of a huge folder are available after the first page.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from blobmount.namespace.names import note_skipped, valid_segment
from blobmount.storage.base import BlobProps, StorageClient

log = logging.getLogger(__name__)


@dataclass(slots=True)
class DirEntry:
    name: str
    is_dir: bool
    props: BlobProps | None  # the blob (files, marker folders); None for prefix-only folders


class DirListing:
    def __init__(self, storage: StorageClient, blob_prefix: str, created: float) -> None:
        self._storage = storage
        self.blob_prefix = blob_prefix  # '' for the root of the container, else ends with '/'
        self.created = created
        self.entries: list[DirEntry] = []
        self._index: dict[str, int] = {}
        self._continuation: str | None = None
        self.complete = False
        self.pages = 0
        self._lock = trio.Lock()

    def find(self, name: str) -> DirEntry | None:
        i = self._index.get(name)
        return None if i is None else self.entries[i]

    async def ensure(self, count: int) -> None:
        """Fetch pages until at least `count` entries are known or the listing is complete."""
        while len(self.entries) < count and not self.complete:
            async with self._lock:
                if len(self.entries) >= count or self.complete:
                    return
                await self._next_page()

    async def _next_page(self) -> None:
        page = await self._storage.list_page(
            self.blob_prefix, delimiter="/", continuation=self._continuation
        )
        self.pages += 1
        for folder in page.prefixes:
            self._add(folder[len(self.blob_prefix) : -1], folder, True, None)
        for blob in page.blobs:
            self._add(blob.name[len(self.blob_prefix) :], blob.name, blob.is_dir_marker, blob)
        self._continuation = page.continuation
        self.complete = page.continuation is None

    def _add(self, name: str, blob_name: str, is_dir: bool, props: BlobProps | None) -> None:
        if not valid_segment(name):
            if name != "" or not is_dir:  # "dir/" itself can be listed as a marker
                note_skipped(blob_name, "not a valid file name")
            return
        i = self._index.get(name)
        if i is None:
            self._index[name] = len(self.entries)
            self.entries.append(DirEntry(name, is_dir, props))
            return
        existing = self.entries[i]
        if is_dir and not existing.is_dir:
            # A blob "x" next to a folder "x/": the folder wins (it holds the data).
            note_skipped(
                existing.props.name if existing.props else blob_name, "shadowed by a folder"
            )
            self.entries[i] = DirEntry(name, True, props)
        elif is_dir and existing.props is None and props is not None:
            existing.props = props  # a marker blob for a folder already seen: keep its mtime
        elif not is_dir and existing.is_dir:
            note_skipped(blob_name, "shadowed by a folder")
