"""InMemoryStorageClient: a complete blob store held in a dict.

Not a mock: it lists, pins versions and fails the way Azure does, so the unit tests of everything
above the storage layer run against real behaviour. Helpers (`put`, `delete`) change the store the
way another writer would.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import time

import trio

from blobmount.errors import BlobChanged, BlobNotFound
from blobmount.storage.base import (
    MAX_LIST_PAGE,
    BlobProps,
    ListPage,
    RangeWithProps,
    StorageClient,
)
from blobmount.storage.sorted_listing import sorted_text_page

_etags = itertools.count(1)


class InMemoryStorageClient(StorageClient):
    def __init__(self, location: str = "memory/container") -> None:
        self.location = location
        self._data: dict[str, bytes] = {}
        self._props: dict[str, BlobProps] = {}
        self._names: list[str] = []  # sorted, for listing

    # -- changing the store (what another writer would do) ---------------------------------

    def put(
        self, name: str, data: bytes, *, dir_marker: bool = False, md5: bool = True
    ) -> BlobProps:
        """Create or replace a blob; a replacement gets a new ETag."""
        if name not in self._data:
            bisect.insort(self._names, name)
        props = BlobProps(
            name=name,
            size=len(data),
            etag=f'"0x{next(_etags):016X}"',
            last_modified=time.time(),
            content_md5=hashlib.md5(data).digest() if md5 else None,
            is_dir_marker=dir_marker,
        )
        self._data[name] = bytes(data)
        self._props[name] = props
        return props

    def delete(self, name: str) -> None:
        del self._data[name]
        del self._props[name]
        self._names.pop(bisect.bisect_left(self._names, name))

    # -- StorageClient -------------------------------------------------------------------

    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        continuation: str | None = None,
        max_results: int = MAX_LIST_PAGE,
    ) -> ListPage:
        await trio.lowlevel.checkpoint()
        names, props = self._names, self._props
        return sorted_text_page(
            names,
            lambda position: props[names[position]],
            prefix,
            delimiter,
            continuation,
            max_results,
        )

    async def get_properties(self, name: str) -> BlobProps:
        await trio.lowlevel.checkpoint()
        try:
            return self._props[name]
        except KeyError:
            raise BlobNotFound(f"blob not found: {name}") from None

    async def get_range(self, name: str, etag: str, start: int, length: int) -> bytes:
        await trio.lowlevel.checkpoint()
        props = self._props.get(name)
        if props is None:
            raise BlobNotFound(f"blob not found: {name}")
        if props.etag != etag:
            raise BlobChanged(f"blob changed: {name}")
        return self._data[name][start : start + length]

    async def get_range_with_props(
        self, name: str, etag: str, start: int, length: int
    ) -> RangeWithProps:
        data = await self.get_range(name, etag, start, max(0, length))
        return RangeWithProps(data, self._props[name])
