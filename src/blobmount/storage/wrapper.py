"""WrappingStorageClient: the base of a StorageClient that stands in front of another one.

A wrapper (retries, flow control, a snapshot's pinning, counting) holds `inner`, shows its
`location` and closes it; most also send every call through one piece of logic. This base does
the holding and the forwarding: each operation goes to `inner` through `_call`, which passes it
straight on unless a subclass overrides it; a subclass that treats one operation apart
overrides that operation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from blobmount.storage.base import (
    MAX_LIST_PAGE,
    BlobProps,
    ListPage,
    RangeWithProps,
    StorageClient,
)

T = TypeVar("T")

#: describes one operation for a log line or an error, when one is written
Describe = Callable[[], str]


class WrappingStorageClient(StorageClient):
    """Forwards every operation to `inner` through `_call`."""

    def __init__(self, inner: StorageClient) -> None:
        self.inner = inner
        self.location = inner.location

    async def _call(self, what: Describe, key: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Run one operation on `inner` (`fn`). `what()` describes it for the log and errors
        (called only when one is written: most calls never format it); `key` is the blob it is
        about, or `list:<prefix>` for a listing."""
        return await fn()

    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        continuation: str | None = None,
        max_results: int = MAX_LIST_PAGE,
    ) -> ListPage:
        return await self._call(
            lambda: f"list {prefix!r}",
            f"list:{prefix}",
            lambda: self.inner.list_page(
                prefix, delimiter=delimiter, continuation=continuation, max_results=max_results
            ),
        )

    async def get_properties(self, name: str) -> BlobProps:
        return await self._call(
            lambda: f"get properties of {name!r}", name, lambda: self.inner.get_properties(name)
        )

    async def get_range(self, name: str, etag: str, start: int, length: int) -> bytes:
        return await self._call(
            lambda: f"GET {name!r} bytes {start}+{length}",
            name,
            lambda: self.inner.get_range(name, etag, start, length),
        )

    async def get_range_parts(
        self, name: str, etag: str, start: int, lengths: Sequence[int]
    ) -> list[bytes]:
        return await self._call(
            lambda: f"GET {name!r} bytes {start}+{sum(lengths)}",
            name,
            lambda: self.inner.get_range_parts(name, etag, start, lengths),
        )

    async def get_range_with_props(
        self, name: str, etag: str, start: int, length: int
    ) -> RangeWithProps:
        return await self._call(
            lambda: f"GET {name!r} bytes {start}+{length}",
            name,
            lambda: self.inner.get_range_with_props(name, etag, start, length),
        )

    async def aclose(self) -> None:
        await self.inner.aclose()
