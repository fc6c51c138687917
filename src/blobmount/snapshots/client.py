"""SnapshotStorageClient: a namespace served from a snapshot, reads pinned to its ETags.

It sits on top of the storage stack (below the namespace layer, which cannot tell it from a
live container). Listings and properties come from the `SnapshotTable` alone, so a mount makes
no list or properties request at all, and folders, names and sizes are exactly as recorded.
Reads go to the real client with the recorded ETag, which the components above pin to because
that is the ETag the listing gave them: a blob changed since the snapshot fails the If-Match
(`BlobChanged`), and so does a deleted one (its name is still in the namespace; only its bytes
are gone), which the filesystem turns into EIO while the rest of the dataset reads normally.
Each such blob is named once in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from blobmount.errors import BlobChanged, BlobNotFound
from blobmount.snapshots.format import SnapshotHeader
from blobmount.snapshots.table import SnapshotTable
from blobmount.storage.base import MAX_LIST_PAGE, BlobProps, ListPage, StorageClient
from blobmount.storage.wrapper import Describe, WrappingStorageClient

log = logging.getLogger(__name__)

T = TypeVar("T")

#: blobs named in the log at most; past that, only a count (a dataset rewritten under a job
#: would otherwise log once per file)
LOGGED_BLOBS_LIMIT = 1000


class SnapshotStorageClient(WrappingStorageClient):
    """`inner`'s container as `table` recorded it (see the module docstring)."""

    def __init__(self, inner: StorageClient, table: SnapshotTable, header: SnapshotHeader) -> None:
        super().__init__(inner)
        self.table = table
        self.header = header
        self._logged: set[str] = set()
        self._said_unnamed = False
        self.changed = 0  # reads refused: the blob changed since the snapshot
        self.gone = 0  # reads refused: the blob was deleted since the snapshot

    # -- the namespace, from the table ---------------------------------------------------------

    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        continuation: str | None = None,
        max_results: int = MAX_LIST_PAGE,
    ) -> ListPage:
        await trio.lowlevel.checkpoint()
        return self.table.list_page(
            prefix, delimiter=delimiter, continuation=continuation, max_results=max_results
        )

    async def get_properties(self, name: str) -> BlobProps:
        await trio.lowlevel.checkpoint()
        index = self.table.find(name)
        if index is None:
            raise BlobNotFound(f"{self.location}/{name}: not in the snapshot")
        return self.table.props(index)

    # -- reads, from storage, pinned to the recorded version -----------------------------------

    async def _call(self, what: Describe, key: str, fn: Callable[[], Awaitable[T]]) -> T:
        # the base sends each read here (listings and properties never reach it, see above):
        # `fn` asks `inner` with the ETag the caller pinned, and `key` is the blob's name
        name = key
        try:
            return await fn()
        except BlobChanged:
            self.changed += 1
            self._note(name, "changed since the snapshot was taken; its reads fail (EIO)")
            raise
        except BlobNotFound:
            self.gone += 1
            self._note(name, "was deleted since the snapshot was taken; its reads fail (EIO)")
            # the name is in the namespace, its recorded version is not in storage: the same
            # failure as a changed blob (EIO), not "no such file"
            raise BlobChanged(f"{self.location}/{name}: deleted since the snapshot") from None

    def _note(self, name: str, what: str) -> None:
        if name in self._logged:
            return
        if len(self._logged) < LOGGED_BLOBS_LIMIT:
            self._logged.add(name)
            log.error("blob %s %s (snapshot of %s)", name, what, self.header.source)
        elif not self._said_unnamed:
            self._said_unnamed = True
            log.error(
                "more than %d blobs changed or deleted since the snapshot of %s; not naming the "
                "rest",
                LOGGED_BLOBS_LIMIT,
                self.header.source,
            )

    async def check_reachable(self, prefix: str) -> None:
        """Ask storage about one recorded blob under `prefix` (a properties request, never a
        listing), so missing credentials or a missing container fail before mounting. A blob
        changed or gone since is only logged: its reads will fail, the others work.

        Raises:
            CredentialError, ContainerNotFound, StorageUnavailable.
        """
        index = self.table.first_under(prefix)
        if index is None:
            return
        recorded = self.table.props(index)
        try:
            now = await self.inner.get_properties(recorded.name)
        except BlobNotFound:
            self._note(recorded.name, "was deleted since the snapshot was taken")
            return
        if now.etag != recorded.etag:
            self._note(recorded.name, "changed since the snapshot was taken")
