"""RetryingStorageClient over a fault-injecting in-memory store.

Every test takes pytest-trio's `autojump_clock` (a MockClock with autojump_threshold=0): sleeps
return at once in virtual time, and trio.current_time() measures the backoff exactly.
"""

import logging
import math
import random

import pytest
import trio

from blobmount.errors import (
    BlobChanged,
    BlobNotFound,
    ContainerNotFound,
    CredentialError,
    StorageUnavailable,
)
from blobmount.storage.faulty import FaultyStorageClient
from blobmount.storage.memory import InMemoryStorageClient
from blobmount.storage.overload import Throttled
from blobmount.storage.retry import RetryingStorageClient, RetryStatistics


@pytest.fixture
def store():
    mem = InMemoryStorageClient()
    mem.put("dir/blob", b"0123456789")
    return FaultyStorageClient(mem)


def unavailable(retry_after=None):
    return lambda: StorageUnavailable("HTTP 503 ServerBusy", retry_after_s=retry_after)


async def test_succeeds_after_k_failures(store, autojump_clock):
    client = RetryingStorageClient(store, retries=7, rng=random.Random(1))
    etag = (await store.inner.get_properties("dir/blob")).etag
    store.fail_next("get_range", 3, unavailable())
    assert await client.get_range("dir/blob", etag, 2, 3) == b"234"
    assert store.calls["get_range"] == 4
    assert client.statistics() == RetryStatistics(retries=3, gave_up=0)


async def test_parts_are_retried_and_fail_like_the_range_they_are(store, autojump_clock):
    client = RetryingStorageClient(store, retries=3, rng=random.Random(1))
    etag = (await store.inner.get_properties("dir/blob")).etag
    store.fail_next("get_range", 2, unavailable())
    assert await client.get_range_parts("dir/blob", etag, 1, [3, 4]) == [b"123", b"4567"]
    assert store.calls["get_range"] == 3


@pytest.mark.parametrize("op", ["list_page", "get_properties", "get_range"])
async def test_every_operation_is_retried(store, op, autojump_clock):
    client = RetryingStorageClient(store, retries=2)
    etag = (await store.inner.get_properties("dir/blob")).etag
    store.fail_next(op, 2, unavailable())
    calls = {
        "list_page": lambda: client.list_page("dir/"),
        "get_properties": lambda: client.get_properties("dir/blob"),
        "get_range": lambda: client.get_range("dir/blob", etag, 0, 4),
    }
    await calls[op]()
    assert store.calls[op] == 3


async def test_gives_up_after_retries_plus_one_attempts(store, caplog, autojump_clock):
    client = RetryingStorageClient(store, retries=4)
    store.fail_next("get_properties", 100, unavailable())
    with (
        caplog.at_level(logging.DEBUG, logger="blobmount.storage.retry"),
        pytest.raises(StorageUnavailable),
    ):
        await client.get_properties("dir/blob")
    assert store.calls["get_properties"] == 5
    assert client.statistics() == RetryStatistics(retries=4, gave_up=1)
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(debug) == 4
    assert len(warnings) == 1
    assert "giving up after 5 attempt" in warnings[0].getMessage()


async def test_zero_retries_means_one_attempt(store, autojump_clock):
    client = RetryingStorageClient(store, retries=0)
    store.fail_next("get_properties", 1, unavailable())
    with pytest.raises(StorageUnavailable):
        await client.get_properties("dir/blob")
    assert store.calls["get_properties"] == 1


@pytest.mark.parametrize(
    "error",
    [
        BlobNotFound("gone"),
        BlobChanged("changed"),
        CredentialError("denied"),
        ContainerNotFound("no container"),
    ],
)
async def test_permanent_errors_are_not_retried(store, error, autojump_clock):
    client = RetryingStorageClient(store, retries=7)
    store.fail_next("get_properties", 1, error)
    with pytest.raises(type(error)):
        await client.get_properties("dir/blob")
    assert store.calls["get_properties"] == 1
    assert client.statistics() == RetryStatistics(retries=0, gave_up=0)


async def test_real_not_found_is_not_retried(store, autojump_clock):
    client = RetryingStorageClient(store, retries=7)
    with pytest.raises(BlobNotFound):
        await client.get_properties("nope")
    assert store.calls["get_properties"] == 1


async def test_backoff_is_exponential_with_full_jitter_and_capped(store, autojump_clock):
    # rng.uniform(0, x) returns x: we see the ceilings themselves
    class Top(random.Random):
        def uniform(self, a, b):
            return b

    client = RetryingStorageClient(store, retries=7, base_delay_s=0.1, max_delay_s=1.0, rng=Top())
    store.fail_next("get_properties", 7, unavailable())
    t0 = trio.current_time()
    await client.get_properties("dir/blob")
    elapsed = trio.current_time() - t0
    # 0.1 + 0.2 + 0.4 + 0.8 + 1.0 + 1.0 + 1.0
    assert elapsed == pytest.approx(4.5)


async def test_jitter_stays_below_the_ceiling(store, autojump_clock):
    client = RetryingStorageClient(store, retries=3, base_delay_s=1.0, max_delay_s=8.0)
    store.fail_next("get_properties", 3, unavailable())
    t0 = trio.current_time()
    await client.get_properties("dir/blob")
    assert 0 <= trio.current_time() - t0 <= 1.0 + 2.0 + 4.0


async def test_retry_after_is_honoured(store, autojump_clock):
    client = RetryingStorageClient(store, retries=3, base_delay_s=0.1, max_delay_s=0.2)
    store.fail_next("get_properties", 2, unavailable(retry_after=5.0))
    t0 = trio.current_time()
    await client.get_properties("dir/blob")
    # two pauses of at least Retry-After each, jitter (<= 0.2) cannot lengthen them past it
    assert trio.current_time() - t0 == pytest.approx(10.0)


async def test_retry_after_is_capped(store, autojump_clock):
    client = RetryingStorageClient(store, retries=1, max_retry_after_s=60.0)
    store.fail_next("get_properties", 1, unavailable(retry_after=3600.0))
    t0 = trio.current_time()
    await client.get_properties("dir/blob")
    assert trio.current_time() - t0 == pytest.approx(60.0)


async def test_cancellation_during_backoff_propagates(store, autojump_clock):
    client = RetryingStorageClient(store, retries=7, base_delay_s=10.0, max_delay_s=10.0)
    store.fail_next("get_properties", 100, unavailable(retry_after=30.0))
    with trio.move_on_after(45) as scope:
        await client.get_properties("dir/blob")
    assert scope.cancelled_caught
    assert store.calls["get_properties"] == 2  # attempts at t=0 and t=30, then cancelled
    assert client.statistics().gave_up == 0


async def test_location_and_aclose_pass_through(store, autojump_clock):
    client = RetryingStorageClient(store)
    assert client.location == store.location
    await client.aclose()


def test_faulty_rejects_unknown_operations(store):
    with pytest.raises(ValueError, match="unknown operation"):
        store.fail_next("put_blob", 1, unavailable())


# -- refusals while storage serves others ------------------------------------------------------


class ServedAccount:
    """A pacer whose account storage answered, last, a request sent at `answered_sent_at`
    (inf: it keeps answering others meanwhile)."""

    def __init__(self, answered_sent_at: float) -> None:
        self.answered_sent_at = answered_sent_at
        self.refusals_retried = 0

    def pause_remaining(self) -> float:
        return 0.0

    def answered_since(self, when: float) -> bool:
        return self.answered_sent_at >= when

    def refusal_retried(self) -> None:
        self.refusals_retried += 1


def refused(status=503):
    return lambda: Throttled(f"HTTP {status} ServerBusy", status=status)


@pytest.mark.parametrize("status", [503, 429])
async def test_refusals_while_storage_serves_others_use_up_no_retry(store, status, autojump_clock):
    """Behind a rate limit, which request is refused is luck: 7 refusals in a row with 2
    retries still end in the bytes, as long as other requests are answered meanwhile (their
    backoff, at most 12.7 s in all, stays within the budget)."""
    account = ServedAccount(math.inf)
    client = RetryingStorageClient(store, retries=2, pacer=account)
    etag = (await store.inner.get_properties("dir/blob")).etag
    store.fail_next("get_range", 7, refused(status))
    assert await client.get_range("dir/blob", etag, 0, 4) == b"0123"
    assert store.calls["get_range"] == 8
    assert client.statistics() == RetryStatistics(retries=7, gave_up=0)
    assert account.refusals_retried == 6  # the first refusal counts


@pytest.mark.parametrize(
    ("retries", "answered_sent_at", "failure", "tries"),
    [
        (0, math.inf, refused(), 1),  # no retries allowed: a refusal fails at once
        (2, -math.inf, refused(), 3),  # storage answers nobody: every refusal counts
        # its last answer was to a request sent 5 s before this one: an outage since
        (2, -5.0, refused(), 3),
        (2, math.inf, refused(500), 3),  # an internal error may be the blob's own: it counts
        (2, math.inf, unavailable(), 3),  # a reset, a timeout, a short body
    ],
    ids=["no-retries", "nobody-served", "served-before", "500", "not-throttled"],
)
async def test_failures_that_count_even_with_a_pacer(
    store, retries, answered_sent_at, failure, tries, autojump_clock
):
    pacer = ServedAccount(trio.current_time() + answered_sent_at)
    client = RetryingStorageClient(store, retries=retries, pacer=pacer)
    store.fail_next("get_properties", 100, failure)
    with pytest.raises(StorageUnavailable):
        await client.get_properties("dir/blob")
    assert store.calls["get_properties"] == tries
    assert pacer.refusals_retried == 0


async def test_refusals_count_again_once_the_budget_is_spent(store, autojump_clock):
    account = ServedAccount(math.inf)
    client = RetryingStorageClient(store, retries=2, pacer=account, throttled_budget_s=20.0)
    store.fail_next("get_properties", 1000, refused())
    started = trio.current_time()
    with pytest.raises(Throttled):
        await client.get_properties("dir/blob")
    took = trio.current_time() - started
    # free retries for 20 s (backoff capped at 8 s each), then the 2 retries that count
    assert 20.0 <= took <= 20.0 + 3 * 8.0
    assert account.refusals_retried >= 4
