"""Lazy folder listings, fed either page by page (one folder) or by a flat walk of a subtree.

A DirListing's entries are appended as pages arrive; an entry's index never changes, so readdir
offsets stay valid while the listing grows, and the first entries of a huge folder are available
after the first page. Pages are fetched only when a reader needs entries past the end of what is
known, so a reader that stops early stops the listing.

Two ways to fill listings:
- *hierarchical*: one list request per page of one folder (delimiter '/'): the cheapest way to
  list one folder, but a walk of a tree costs one request per folder.
- *flat*: `FlatWalk` lists a whole subtree with no delimiter (5,000 names a page) and fills the
  listing of every folder below it from that one stream. Blob names sharing a prefix are
  contiguous in the (sorted) stream, so a folder is complete as soon as the stream has moved past
  its prefix. A walk of 50,000 blobs in 5,000 folders then costs 10 requests, not 5,001.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

import trio

from blobmount.namespace.inodes import InodeTable, Node, join
from blobmount.namespace.names import (
    UnsafeName,
    is_folder_blob,
    note_skipped,
    path_problem,
    path_segments,
    valid_segment,
)
from blobmount.storage.base import BlobProps, StorageClient

log = logging.getLogger(__name__)


class DirEntry:
    """What a properties request (or a one-item probe) says a name is; the node of that name is
    made or updated from it (listings make their nodes directly)."""

    __slots__ = ("etag", "is_dir", "mtime", "name", "size")

    def __init__(self, name: str, is_dir: bool, size: int, mtime: float, etag: str | None) -> None:
        self.name = name
        self.is_dir = is_dir
        self.size = size
        self.mtime = mtime
        self.etag = etag

    @classmethod
    def of(cls, name: str, is_dir: bool, props: BlobProps | None) -> DirEntry:
        if props is None:
            return cls(name, is_dir, 0, 0.0, None)
        return cls(name, is_dir, props.size, props.last_modified, props.etag)


class DirListing:
    """The entries of one folder, as nodes of the inode table. `blob_prefix` is '' for the
    container root, else ends in '/'; `folder` is the folder's path below the mount root.

    The table finds a listed name by its path, so a listing keeps no index of its own. Once the
    catalog drops the listing (its TTL ended) it is *detached*: its nodes are released to the
    table, and a reader still holding it gets the rest of its entries as nodes of its own."""

    def __init__(self, table: InodeTable, blob_prefix: str, folder: str, created: float) -> None:
        self.blob_prefix = blob_prefix
        self.folder = folder
        self.created = created
        self.entries: list[Node] = []
        self._table = table
        self._complete = False
        self._detached = False
        self._own: dict[str, Node] | None = None  # a detached listing's index
        self._last_folder = ""  # a walk places the same folder once per blob in it

    @property
    def complete(self) -> bool:
        return self._complete

    def find(self, name: str) -> Node | None:
        return self._held(name)[1]

    def _held(self, name: str) -> tuple[int, Node | None]:
        """The inode number for `name`, and the node this listing holds for it, if any."""
        if self._detached:
            return self._table.number(join(self.folder, name)), self._own_index().get(name)
        number, node = self._table.locate(self.folder, name)
        return number, node if node is not None and node.listed else None

    def _own_index(self) -> dict[str, Node]:
        if self._own is None:
            self._own = {node.name: node for node in self.entries}
        return self._own

    def detach(self) -> None:
        """The catalog no longer holds this listing: the table may free its nodes."""
        if not self._detached:
            self._detached = True
            for node in self.entries:
                self._table.unlist(node)

    async def ensure(self, count: int) -> None:
        """Fetch until at least `count` entries are known or the listing is complete."""
        raise NotImplementedError

    def skip(self, blob_name: str, is_dir: bool) -> None:
        """Leave out a child whose name fails the rule, logged once with the reason the rule
        gives for the whole name below the mount root (what download of the same prefix says)."""
        # the mount root's prefix: blob_prefix is it plus this folder's path and a '/'
        root = len(self.blob_prefix) - (len(self.folder) + 1 if self.folder else 0)
        why = path_problem(blob_name[root:], is_dir=is_dir)
        note_skipped(blob_name, why or "not a valid file name")

    def add(self, name: str, is_dir: bool, props: BlobProps | None, blob_name: str) -> None:
        """Add a child whose name passed the rule (`names.valid_segment`). A name seen twice (a
        marker blob and the prefix of the same folder, or a blob `x` beside a folder `x/`)
        keeps one entry: the folder wins."""
        if is_dir and props is None and name == self._last_folder:
            return
        if is_dir:
            self._last_folder = name
        size, mtime, etag = (0, 0.0, None) if props is None else _attributes(props)
        number, existing = self._held(name)
        if existing is None:
            node = Node(number, self.folder, name, is_dir, size, mtime, etag, self.created)
            if self._detached:  # a node of its own (readdir puts it in the table if need be)
                self._own_index()[name] = node
            else:
                node = self._table.list_entry(node)
            self.entries.append(node)
        elif is_dir and not existing.is_dir:
            note_skipped(self.blob_prefix + name, "a blob shadowed by a folder of the same name")
            existing.set(True, size, mtime, etag, self.created)
        elif is_dir and existing.etag is None and props is not None:
            existing.set(True, size, mtime, etag, self.created)  # marker blob: keep its mtime
        elif not is_dir and existing.is_dir:
            note_skipped(blob_name, "a blob shadowed by a folder of the same name")


def _attributes(props: BlobProps) -> tuple[int, float, str | None]:
    return props.size, props.last_modified, props.etag


class PagedListing(DirListing):
    """A folder listed on its own, one delimiter page at a time."""

    def __init__(
        self,
        storage: StorageClient,
        table: InodeTable,
        blob_prefix: str,
        folder: str,
        created: float,
    ) -> None:
        super().__init__(table, blob_prefix, folder, created)
        self._storage = storage
        self._continuation: str | None = None
        self._lock = trio.Lock()
        self.pages = 0

    async def ensure(self, count: int) -> None:
        while len(self.entries) < count and not self._complete:
            async with self._lock:
                if len(self.entries) >= count or self._complete:
                    return
                page = await self._storage.list_page(
                    self.blob_prefix, delimiter="/", continuation=self._continuation
                )
                self.pages += 1
                cut = len(self.blob_prefix)
                for folder in page.prefixes:
                    name = folder[cut:-1]
                    if valid_segment(name):
                        self.add(name, True, None, folder)
                    else:
                        self.skip(folder, True)
                for blob in page.blobs:
                    name = blob.name[cut:]
                    if valid_segment(name):
                        self.add(name, blob.is_dir_marker, blob, blob.name)
                    else:
                        is_dir = is_folder_blob(blob.name, blob.size, blob.is_dir_marker)
                        if name or not is_dir:  # a folder blob named `prefix` is this folder
                            self.skip(blob.name, is_dir)
                self._continuation = page.continuation
                self._complete = page.continuation is None


class WalkedListing(DirListing):
    """A folder filled by a FlatWalk of a subtree that contains it."""

    def __init__(
        self, walk: FlatWalk, table: InodeTable, blob_prefix: str, folder: str, created: float
    ) -> None:
        super().__init__(table, blob_prefix, folder, created)
        self.walk = walk

    @property
    def complete(self) -> bool:
        if not self._complete and self.walk.passed(self.blob_prefix):
            self._complete = True
        return self._complete

    async def ensure(self, count: int) -> None:
        while len(self.entries) < count and not self.complete:
            await self.walk.advance()


#: returns the listing the walk should fill for a folder's blob prefix, or None when that
#: folder is already listed some other way (the walk then leaves it alone)
ListingFor = Callable[[str], "WalkedListing | None"]


class FlatWalk:
    """One flat (delimiter-less) listing of a subtree, feeding every folder listing below it."""

    def __init__(
        self, storage: StorageClient, root_prefix: str, base_prefix: str, created: float
    ) -> None:
        self._storage = storage
        self.base_prefix = base_prefix
        #: the mount root's prefix: names are checked below it, as the mount shows them
        self._root_prefix = root_prefix
        #: how many segments of a name (below the root) lead to the base folder
        self._depth = base_prefix[len(root_prefix) :].count("/")
        self.created = created
        self._continuation: str | None = None
        self._last_name = ""
        self.done = False
        self.pages = 0
        self._lock = trio.Lock()
        self._listing_for: ListingFor | None = None
        #: the listings this walk fills, by blob prefix (see ListingCatalog._walked_listing)
        self.listings: dict[str, WalkedListing] = {}

    def attach(self, listing_for: ListingFor) -> None:
        self._listing_for = listing_for

    def passed(self, blob_prefix: str) -> bool:
        """True once every name under `blob_prefix` has been seen."""
        if self.done:
            return True
        last = self._last_name
        return last > blob_prefix and not last.startswith(blob_prefix)

    async def advance(self) -> None:
        """Fetch the next page (one at a time; concurrent callers share it)."""
        pages_before = self.pages
        async with self._lock:
            if self.done or self.pages != pages_before:
                return  # someone else fetched a page while we waited: look again first
            page = await self._storage.list_page(
                self.base_prefix, delimiter=None, continuation=self._continuation
            )
            self.pages += 1
            for blob in page.blobs:
                self._place(blob)
            if page.blobs:
                self._last_name = page.blobs[-1].name
            self._continuation = page.continuation
            self.done = page.continuation is None

    def _place(self, blob: BlobProps) -> None:
        assert self._listing_for is not None, "attach() a listing registry first"
        name = blob.name
        rel = name[len(self._root_prefix) :]
        is_dir = is_folder_blob(name, blob.size, blob.is_dir_marker)
        last: str | None
        try:
            segments = path_segments(rel, is_dir=is_dir)
        except UnsafeName as exc:
            note_skipped(name, str(exc))
            # the folders before the bad segment still exist, as a paged listing (which sees
            # them as prefixes) shows them
            segments = list(itertools.takewhile(valid_segment, rel.split("/")[:-1]))
            parents, last = segments[self._depth :], None
        else:
            segments = segments[self._depth :]
            if is_dir and (name.endswith("/") or not segments):
                # a folder's own marker named with its '/' (or the base folder's): the folder
                # is placed as its prefix, without the blob's attributes, as a paged listing
                # sees it
                parents, last = segments, None
            else:
                parents, last = segments[:-1], segments[-1]
        prefix = self.base_prefix
        for segment in parents:
            listing = self._listing_for(prefix)
            if listing is not None:
                listing.add(segment, True, None, prefix + segment + "/")
            prefix += segment + "/"
        listing = self._listing_for(prefix)
        if listing is not None and last is not None:
            listing.add(last, blob.is_dir_marker, blob, name)
