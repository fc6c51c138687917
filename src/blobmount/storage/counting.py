"""CountingStorageClient: counts requests and bytes per operation, for stats and tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from blobmount.errors import StorageError
from blobmount.storage.base import (
    MAX_LIST_PAGE,
    BlobProps,
    ListPage,
    RangeWithProps,
    StorageClient,
)
from blobmount.storage.wrapper import WrappingStorageClient


@dataclass(frozen=True, slots=True)
class StorageStats:
    list_requests: int
    properties_requests: int
    range_requests: int
    range_bytes: int
    errors: dict[str, int]

    @property
    def requests(self) -> int:
        return self.list_requests + self.properties_requests + self.range_requests


class CountingStorageClient(WrappingStorageClient):
    def __init__(self, inner: StorageClient) -> None:
        super().__init__(inner)
        self.list_requests = 0
        self.properties_requests = 0
        self.range_requests = 0
        self.range_bytes = 0
        self._errors: dict[str, int] = {}

    def _failed(self, exc: StorageError) -> None:
        kind = type(exc).__name__
        self._errors[kind] = self._errors.get(kind, 0) + 1

    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        continuation: str | None = None,
        max_results: int = MAX_LIST_PAGE,
    ) -> ListPage:
        self.list_requests += 1
        try:
            return await self.inner.list_page(
                prefix, delimiter=delimiter, continuation=continuation, max_results=max_results
            )
        except StorageError as exc:
            self._failed(exc)
            raise

    async def get_properties(self, name: str) -> BlobProps:
        self.properties_requests += 1
        try:
            return await self.inner.get_properties(name)
        except StorageError as exc:
            self._failed(exc)
            raise

    async def get_range(self, name: str, etag: str, start: int, length: int) -> bytes:
        self.range_requests += 1
        try:
            data = await self.inner.get_range(name, etag, start, length)
        except StorageError as exc:
            self._failed(exc)
            raise
        self.range_bytes += len(data)
        return data

    async def get_range_parts(
        self, name: str, etag: str, start: int, lengths: Sequence[int]
    ) -> list[bytes]:
        self.range_requests += 1
        try:
            parts = await self.inner.get_range_parts(name, etag, start, lengths)
        except StorageError as exc:
            self._failed(exc)
            raise
        self.range_bytes += sum(len(part) for part in parts)
        return parts

    async def get_range_with_props(
        self, name: str, etag: str, start: int, length: int
    ) -> RangeWithProps:
        self.range_requests += 1  # a GET, whatever else its answer tells
        try:
            got = await self.inner.get_range_with_props(name, etag, start, length)
        except StorageError as exc:
            self._failed(exc)
            raise
        self.range_bytes += len(got.data)
        return got

    def statistics(self) -> StorageStats:
        return StorageStats(
            list_requests=self.list_requests,
            properties_requests=self.properties_requests,
            range_requests=self.range_requests,
            range_bytes=self.range_bytes,
            errors=dict(self._errors),
        )
