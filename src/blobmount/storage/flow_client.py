"""FlowControlledStorageClient: every request (every try of it) goes through the account's flow
controller (storage/flow.py): it waits for a slot and for the account's Retry-After pause, fails
at once while the circuit breaker is open, and its outcome teaches the controller.

It sits right above the client that sends requests, under RetryingStorageClient, so each retry
is a request of its own to the controller.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from blobmount.errors import StorageError, StorageUnavailable
from blobmount.storage.base import (
    MAX_LIST_PAGE,
    BlobProps,
    ListPage,
    RangeWithProps,
    StorageClient,
)
from blobmount.storage.flow import FlowController, FlowStats

log = logging.getLogger(__name__)

T = TypeVar("T")


class FlowControlledStorageClient(StorageClient):
    """Wraps a StorageClient; `flow` is its account's controller (shared with other stacks)."""

    def __init__(self, inner: StorageClient, flow: FlowController) -> None:
        self.inner = inner
        self.flow = flow
        self.location = inner.location

    def statistics(self) -> FlowStats:
        return self.flow.statistics()

    async def _paced(self, what: str, key: str, fn: Callable[[], Awaitable[T]]) -> T:
        sent = await self.flow.acquire(what)
        try:
            result = await fn()
        except StorageUnavailable as exc:
            sent.failed(exc, key)
            raise
        except StorageError:
            sent.answered()  # 404, 412, 403...: storage is there and answering
            raise
        except BaseException:
            sent.abandoned()
            raise
        sent.answered()
        return result

    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        continuation: str | None = None,
        max_results: int = MAX_LIST_PAGE,
    ) -> ListPage:
        return await self._paced(
            f"list {prefix!r}",
            f"list:{prefix}",
            lambda: self.inner.list_page(
                prefix, delimiter=delimiter, continuation=continuation, max_results=max_results
            ),
        )

    async def get_properties(self, name: str) -> BlobProps:
        return await self._paced(
            f"get properties of {name!r}", name, lambda: self.inner.get_properties(name)
        )

    async def get_range(self, name: str, etag: str, start: int, length: int) -> bytes:
        return await self._paced(
            f"GET {name!r} bytes {start}+{length}",
            name,
            lambda: self.inner.get_range(name, etag, start, length),
        )

    async def get_range_parts(
        self, name: str, etag: str, start: int, lengths: Sequence[int]
    ) -> list[bytes]:
        return await self._paced(
            f"GET {name!r} bytes {start}+{sum(lengths)}",
            name,
            lambda: self.inner.get_range_parts(name, etag, start, lengths),
        )

    async def get_range_with_props(
        self, name: str, etag: str, start: int, length: int
    ) -> RangeWithProps:
        return await self._paced(
            f"GET {name!r} bytes {start}+{length}",
            name,
            lambda: self.inner.get_range_with_props(name, etag, start, length),
        )

    async def aclose(self) -> None:
        await self.inner.aclose()
