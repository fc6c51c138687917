"""RetryingStorageClient: retries transient storage failures with backoff.

Only StorageUnavailable (throttling, 5xx, resets, timeouts, short bodies) is retried; every other
error (BlobNotFound, BlobChanged, CredentialError, ContainerNotFound, ...) is final and passes
straight through. Backoff is exponential with full jitter, and a server's Retry-After is honoured
(up to a cap, so a silly header cannot park a read for an hour). Sleeping uses trio.sleep, so
trio.testing.MockClock makes tests instant.

With a `pacer` (the account's flow controller, storage/flow.py), a retry also waits out the
account-wide Retry-After pause that another request received; and CircuitOpen (the breaker is
open: storage has failed every request for a while) ends the operation at once, unretried.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import trio

from blobmount.errors import StorageUnavailable
from blobmount.storage.base import StorageClient
from blobmount.storage.overload import CircuitOpen
from blobmount.storage.wrapper import Describe, WrappingStorageClient

log = logging.getLogger(__name__)

T = TypeVar("T")

#: AZUREML_DATASET_HTTP_RETRY_COUNT's default
DEFAULT_RETRIES = 7


class Pacer(Protocol):
    """What a retry asks of the account's flow controller."""

    def pause_remaining(self) -> float: ...


@dataclass(frozen=True, slots=True)
class RetryStatistics:
    """Counts since the client was made."""

    retries: int  # attempts repeated after a transient failure
    gave_up: int  # operations that failed even after every retry


class RetryingStorageClient(WrappingStorageClient):
    """Wraps a StorageClient; retries StorageUnavailable up to `retries` extra attempts.

    The pause before retry n (n = 0, 1, ...) is uniform in [0, min(max_delay_s,
    base_delay_s * 2**n)] ("full jitter"), but at least the server's Retry-After, itself capped
    at `max_retry_after_s`.
    """

    def __init__(
        self,
        inner: StorageClient,
        *,
        retries: int = DEFAULT_RETRIES,
        base_delay_s: float = 0.1,
        max_delay_s: float = 8.0,
        max_retry_after_s: float = 60.0,
        rng: random.Random | None = None,
        pacer: Pacer | None = None,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        super().__init__(inner)
        self._retries = retries
        self._base_delay_s = base_delay_s
        self._max_delay_s = max_delay_s
        self._max_retry_after_s = max_retry_after_s
        self._rng = rng or random.Random()
        self._pacer = pacer
        self._retry_count = 0
        self._gave_up = 0

    def statistics(self) -> RetryStatistics:
        return RetryStatistics(retries=self._retry_count, gave_up=self._gave_up)

    def _delay(self, attempt: int, exc: StorageUnavailable) -> float:
        ceiling = min(self._max_delay_s, self._base_delay_s * (2**attempt))
        delay = self._rng.uniform(0.0, ceiling)
        if exc.retry_after_s is not None:
            delay = max(delay, min(exc.retry_after_s, self._max_retry_after_s))
        if self._pacer is not None:
            # a Retry-After another request of the account got (the controller caps it)
            delay = max(delay, self._pacer.pause_remaining())
        return delay

    async def _call(self, what: Describe, key: str, fn: Callable[[], Awaitable[T]]) -> T:
        attempt = 0
        while True:
            try:
                return await fn()
            except CircuitOpen as exc:
                log.debug("%s: %s", what(), exc)
                raise
            except StorageUnavailable as exc:
                if attempt >= self._retries:
                    self._gave_up += 1
                    log.warning("%s: giving up after %d attempt(s): %s", what(), attempt + 1, exc)
                    raise
                delay = self._delay(attempt, exc)
                attempt += 1
                self._retry_count += 1
                log.debug(
                    "%s: retry %d/%d in %.2fs after: %s", what(), attempt, self._retries, delay, exc
                )
                await trio.sleep(delay)
