"""Hooked: a storage wrapper that runs a test's coroutine before every ranged GET (to hold a
request in flight, fail it, or note when it was sent), and forwards everything to `inner`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from blobmount.storage.base import RangeWithProps, StorageClient
from blobmount.storage.wrapper import WrappingStorageClient


class Hooked(WrappingStorageClient):
    """Awaits `before(name, start)` before every ranged GET, then forwards it."""

    def __init__(self, inner: StorageClient, before: Callable[[str, int], Awaitable[None]]) -> None:
        super().__init__(inner)
        self.before = before

    async def get_range(self, name: str, etag: str, start: int, length: int) -> bytes:
        await self.before(name, start)
        return await self.inner.get_range(name, etag, start, length)

    async def get_range_parts(
        self, name: str, etag: str, start: int, lengths: Sequence[int]
    ) -> list[bytes]:
        await self.before(name, start)
        return await self.inner.get_range_parts(name, etag, start, lengths)

    async def get_range_with_props(
        self, name: str, etag: str, start: int, length: int
    ) -> RangeWithProps:
        await self.before(name, start)
        return await self.inner.get_range_with_props(name, etag, start, length)
