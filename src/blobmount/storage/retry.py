"""RetryingStorageClient: retries transient storage failures with backoff.

Only StorageUnavailable (throttling, 5xx, resets, timeouts, short bodies) is retried; every other
error (BlobNotFound, BlobChanged, CredentialError, ContainerNotFound, ...) is final and passes
straight through. Backoff is exponential with full jitter, and a server's Retry-After is honoured
(up to a cap, so a silly header cannot park a read for an hour). Sleeping uses trio.sleep, so
trio.testing.MockClock makes tests instant.

With a `pacer` (the account's flow controller, storage/flow.py), a retry also waits out the
account-wide Retry-After pause that another request received; and CircuitOpen (the breaker is
open: storage has failed every request for a while) ends the operation at once, unretried.

Also with a pacer, a refusal by throttling (503 ServerBusy, 429) after an operation's first one
does not use up a retry while storage answers other requests: the account is being served, and
which of its requests a rate limit refuses is luck. Behind a limit that admits N requests a
second in fixed windows, a retry that lands in the spent part of a window is refused again, so a
few reads in ten thousand were refused 8 times in a row and failed with EIO while every other
read went through (the `throttled` benchmark of 2026-12-06). Such refusals are retried, with
the backoff still growing, for at most `throttled_budget_s` of the operation; after that, and
whenever storage answers nothing else, they count as before, so a read still ends (the breaker
or the retry count) and never hangs.
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
from blobmount.storage.overload import CircuitOpen, Throttled
from blobmount.storage.wrapper import Describe, WrappingStorageClient

log = logging.getLogger(__name__)

T = TypeVar("T")

#: AZUREML_DATASET_HTTP_RETRY_COUNT's default
DEFAULT_RETRIES = 7
#: how long an operation retries throttling refusals beyond its retry count while storage
#: answers other requests (see the module docstring)
THROTTLED_BUDGET_S = 30.0
#: answers to requests sent this long before an attempt still show the account is served (a
#: rate limit's window: Azure's targets are per second)
SERVED_WITHIN_S = 1.0
#: the refusals that say "over a rate or a partition's target", nothing about this request
_REFUSAL_STATUSES = (429, 503)


class Pacer(Protocol):
    """What a retry asks of the account's flow controller."""

    def pause_remaining(self) -> float: ...

    def answered_since(self, when: float) -> bool:
        """Whether storage answered a request sent at `when` or later."""
        ...

    def refusal_retried(self) -> None:
        """A refusal is retried without using up a retry (counted in the flow stats)."""
        ...


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
        throttled_budget_s: float = THROTTLED_BUDGET_S,
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
        self._throttled_budget_s = throttled_budget_s
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

    def _refused_by_luck(self, exc: StorageUnavailable, since: float, started: float) -> bool:
        """A throttling refusal while storage answered a request sent since `since` (a rate
        window before the operation's previous attempt: a refusal comes at once, and a limit
        whose window is spent refuses everything until it ends, so the answers that show the
        account is served came before), within the operation's budget: retried without using
        up a retry (see the module docstring)."""
        pacer = self._pacer
        return (
            pacer is not None
            and isinstance(exc, Throttled)
            and exc.status in _REFUSAL_STATUSES
            and trio.current_time() - started < self._throttled_budget_s
            and pacer.answered_since(since)
        )

    async def _call(self, what: Describe, key: str, fn: Callable[[], Awaitable[T]]) -> T:
        attempt = 0  # retries used up
        tries = 0  # attempts made: the backoff grows with these
        started = previous = sent_at = trio.current_time()
        while True:
            try:
                return await fn()
            except CircuitOpen as exc:
                log.debug("%s: %s", what(), exc)
                raise
            except StorageUnavailable as exc:
                # an operation's first refusal always counts: with no retries allowed it
                # fails, and the window before it shows nothing about this operation
                free = tries > 0 and self._refused_by_luck(exc, previous - SERVED_WITHIN_S, started)
                previous = sent_at
                if attempt >= self._retries and not free:
                    self._gave_up += 1
                    log.warning("%s: giving up after %d attempt(s): %s", what(), tries + 1, exc)
                    raise
                delay = self._delay(tries, exc)
                tries += 1
                self._retry_count += 1
                if free:
                    assert self._pacer is not None
                    self._pacer.refusal_retried()
                else:
                    attempt += 1
                log.debug(
                    "%s: retry %d/%d%s in %.2fs after: %s",
                    what(),
                    attempt,
                    self._retries,
                    " (not counted: storage serves others)" if free else "",
                    delay,
                    exc,
                )
                await trio.sleep(delay)
                sent_at = trio.current_time()
