"""FaultyStorageClient: a wrapper that makes chosen calls fail, for tests of failure handling.

    faulty = FaultyStorageClient(InMemoryStorageClient())
    faulty.fail_next("get_range", 3, StorageUnavailable("503"))   # next 3 get_range calls raise
    faulty.calls["get_range"]                                     # attempts seen so far

Each queued failure is used once, in order; when none is queued the call goes to the inner client.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Sequence

import trio

from blobmount.storage.base import (
    MAX_LIST_PAGE,
    BlobProps,
    ListPage,
    RangeWithProps,
    StorageClient,
)

OPERATIONS = ("list_page", "get_properties", "get_range")

#: an exception to raise, or a factory making a fresh one per failure
Fault = BaseException | Callable[[], BaseException]


class FaultyStorageClient(StorageClient):
    def __init__(self, inner: StorageClient) -> None:
        self.inner = inner
        self.location = inner.location
        self.calls: Counter[str] = Counter()
        self._faults: dict[str, deque[Fault]] = {op: deque() for op in OPERATIONS}

    def fail_next(self, op: str, n: int, fault: Fault) -> None:
        """Make the next `n` calls of `op` raise `fault` (an exception or a factory of them)."""
        if op not in self._faults:
            raise ValueError(f"unknown operation {op!r}; expected one of {OPERATIONS}")
        self._faults[op].extend([fault] * n)

    def pending_faults(self, op: str) -> int:
        return len(self._faults[op])

    def clear_faults(self) -> None:
        for queue in self._faults.values():
            queue.clear()

    async def _maybe_fail(self, op: str) -> None:
        self.calls[op] += 1
        # a real failure comes after some I/O: give other tasks (and cancellation) a turn
        await trio.lowlevel.checkpoint()
        queue = self._faults[op]
        if queue:
            fault = queue.popleft()
            raise fault if isinstance(fault, BaseException) else fault()

    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        continuation: str | None = None,
        max_results: int = MAX_LIST_PAGE,
    ) -> ListPage:
        await self._maybe_fail("list_page")
        return await self.inner.list_page(
            prefix, delimiter=delimiter, continuation=continuation, max_results=max_results
        )

    async def get_properties(self, name: str) -> BlobProps:
        await self._maybe_fail("get_properties")
        return await self.inner.get_properties(name)

    async def get_range(self, name: str, etag: str, start: int, length: int) -> bytes:
        await self._maybe_fail("get_range")
        return await self.inner.get_range(name, etag, start, length)

    async def get_range_parts(
        self, name: str, etag: str, start: int, lengths: Sequence[int]
    ) -> list[bytes]:
        await self._maybe_fail("get_range")  # the same request, cut differently
        return await self.inner.get_range_parts(name, etag, start, lengths)

    async def get_range_with_props(
        self, name: str, etag: str, start: int, length: int
    ) -> RangeWithProps:
        await self._maybe_fail("get_range")  # a GET too, whatever else its answer tells
        return await self.inner.get_range_with_props(name, etag, start, length)

    async def aclose(self) -> None:
        await self.inner.aclose()
