"""FlowControlledStorageClient: every request (every try of it) goes through the account's flow
controller (storage/flow.py): it waits for a slot and for the account's Retry-After pause, fails
at once while the circuit breaker is open, and its outcome teaches the controller.

It sits right above the client that sends requests, under RetryingStorageClient, so each retry
is a request of its own to the controller.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from blobmount.errors import StorageError, StorageUnavailable
from blobmount.storage.base import StorageClient
from blobmount.storage.flow import FlowController, FlowStats
from blobmount.storage.wrapper import Describe, WrappingStorageClient

T = TypeVar("T")


class FlowControlledStorageClient(WrappingStorageClient):
    """Wraps a StorageClient; `flow` is its account's controller (shared with other stacks)."""

    def __init__(self, inner: StorageClient, flow: FlowController) -> None:
        super().__init__(inner)
        self.flow = flow

    def statistics(self) -> FlowStats:
        return self.flow.statistics()

    async def _call(self, what: Describe, key: str, fn: Callable[[], Awaitable[T]]) -> T:
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
