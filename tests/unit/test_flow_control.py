"""The flow controller's parts: the adaptive in-flight limit and the circuit breaker (pure), and
the controller and its client wrapper over a fault-injecting in-memory store, on trio's
autojump clock (sleeps are instant, trio.current_time() measures them exactly)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest
import trio

from blobmount.errors import BlobNotFound, StorageUnavailable
from blobmount.storage.aimd import InFlightLimit, SendRate, Served
from blobmount.storage.breaker import Admission, BreakerState, CircuitBreaker
from blobmount.storage.faulty import FaultyStorageClient
from blobmount.storage.flow import FlowConfig, FlowController, account_flow
from blobmount.storage.flow_client import FlowControlledStorageClient
from blobmount.storage.memory import InMemoryStorageClient
from blobmount.storage.overload import CircuitOpen, Throttled, TimedOut, is_congestion
from blobmount.storage.retry import RetryingStorageClient

# -- the limit --------------------------------------------------------------------------------


def test_limit_halves_once_per_round_and_never_leaves_its_bounds() -> None:
    limit = InFlightLimit(16)
    assert limit.limit == 16
    assert limit.on_congestion(sent_at=0.0, now=1.0)
    assert limit.limit == 8
    # answers to requests sent before the cut describe the old limit: no second cut
    assert not limit.on_congestion(sent_at=0.5, now=1.1)
    assert limit.limit == 8
    for t in range(10):
        limit.on_congestion(sent_at=2.0 + t, now=2.0 + t)
    assert limit.limit == 1


def test_limit_grows_only_when_it_held_requests_back() -> None:
    limit = InFlightLimit(8)
    limit.on_congestion(sent_at=0.0, now=0.0)  # 4, cap 7
    for _ in range(100):
        limit.on_success(1.0, saturated=False)
    assert limit.limit == 4
    for _ in range(3):
        limit.on_success(1.0, saturated=True)
    assert limit.limit == 7  # quickly back to just below where storage pushed back
    for _ in range(1000):
        limit.on_success(1.5, saturated=True)
    assert limit.limit == 7  # no higher before a probe period has passed
    limit.on_success(2.0, saturated=True)  # a probe: one level up
    for _ in range(20):
        limit.on_success(2.0, saturated=True)
    assert limit.limit == 8


def test_limit_settles_just_below_a_server_that_refuses_beyond_n() -> None:
    """A simulated server refusing requests beyond 5 in flight, 100 requests a second: the
    limit stays near 5 and fewer than 5% of the requests are refused."""
    limit, n, refused, sent = InFlightLimit(32), 5, 0, 0
    levels = []
    for step in range(6000):  # 60 s of 10 ms rounds
        now = step / 100
        sent += 1
        if limit.limit > n:
            refused += 1
            limit.on_congestion(sent_at=now, now=now)
        else:
            limit.on_success(now, saturated=True)
        if step > 1000:
            levels.append(limit.limit)
    assert refused / sent < 0.05
    assert 3 <= sum(levels) / len(levels) <= n


def test_limit_is_back_at_its_ceiling_within_seconds_after_throttling_stops() -> None:
    limit = InFlightLimit(32)
    for t in range(20):
        limit.on_congestion(sent_at=t * 0.1, now=t * 0.1)
    assert limit.limit == 1
    now = 2.0
    while limit.limit < 32 and now < 60:
        now += 0.01
        limit.on_success(now, saturated=True)
    assert now < 2.0 + 2 * 2.0  # about two probe periods


def test_a_cut_stops_at_the_floor_and_none_is_made_there() -> None:
    limit = InFlightLimit(32)
    assert limit.on_congestion(sent_at=0.0, now=0.0, floor=5)  # 16
    assert limit.on_congestion(sent_at=1.0, now=1.0, floor=5)  # 8
    assert limit.on_congestion(sent_at=2.0, now=2.0, floor=5)
    assert limit.limit == 5  # not 4
    assert not limit.on_congestion(sent_at=3.0, now=3.0, floor=5)
    assert limit.limit == 5


# -- what recent successes say, and the send rate ---------------------------------------------


def test_served_measures_rate_and_mean_concurrency_over_the_last_second() -> None:
    served = Served()
    for i in range(100):  # 100 successes in a second, each 30 ms: 3 in flight on average
        served.add(i / 100, 0.03)
    assert served.rate(0.99) == pytest.approx(100)
    assert served.concurrency(0.99) == pytest.approx(3.0)
    assert served.one_at_a_time(0.99) == pytest.approx(1 / 0.03)
    assert served.rate(1.5) == pytest.approx(49)  # the first half has left the window
    assert served.rate(5.0) == 0.0
    assert served.concurrency(5.0) == 0.0
    assert served.one_at_a_time(5.0) == 0.0


def test_the_send_rate_is_cut_from_the_admitted_rate_once_a_window_and_climbs_back() -> None:
    rate = SendRate()
    assert rate.rate(0.0) is None
    assert rate.on_throttled(sent_at=0.0, now=0.0, admitted=200)
    assert rate.rate(0.0) == pytest.approx(140)
    # the rest of a spent window refuses whatever is sent: no further cut within it
    assert not rate.on_throttled(sent_at=0.5, now=0.5, admitted=100)
    assert rate.rate(0.5) == pytest.approx(170)  # half way back up
    assert rate.rate(1.0) == pytest.approx(200)
    assert rate.rate(1.9) == pytest.approx(200)
    assert rate.rate(2.0) == pytest.approx(250)  # the first probe, then faster and bigger ones
    assert rate.rate(2.5) == pytest.approx(375)
    assert rate.rate(3.0) is None  # storage admits far more than it refused at: off
    assert not rate.on


def test_send_rate_cuts_do_not_compound_nor_go_below_the_floor() -> None:
    rate = SendRate()
    assert rate.on_throttled(sent_at=0.0, now=0.0, admitted=200)
    assert rate.on_throttled(sent_at=1.0, now=1.0, admitted=200)
    assert rate.rate(1.0) == pytest.approx(140)  # 0.7 of what storage admits, not 0.49
    assert rate.on_throttled(sent_at=2.0, now=2.0, admitted=10, floor=50)
    assert rate.rate(2.0) == pytest.approx(50)


# -- the breaker ------------------------------------------------------------------------------


def failing(breaker: CircuitBreaker, start: float, end: float, keys: list[str]) -> None:
    t, i = start, 0
    while t <= end:
        breaker.on_failure(t, keys[i % len(keys)])
        t += 0.5
        i += 1


def test_breaker_opens_after_a_while_of_nothing_but_failures_on_several_blobs() -> None:
    breaker = CircuitBreaker(open_after_s=5.0, probe_interval_s=2.0)
    failing(breaker, 0.0, 4.5, ["a", "b"])
    assert breaker.state is BreakerState.CLOSED
    failing(breaker, 5.0, 5.0, ["a"])
    assert breaker.state is BreakerState.OPEN
    assert breaker.opened == 1
    assert breaker.admit(5.1) is Admission.REJECT
    assert breaker.open_s(7.0) == pytest.approx(2.0)
    # one probe after the interval, the others still refused while it runs
    assert breaker.admit(7.0) is Admission.PROBE
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.admit(7.01) is Admission.REJECT
    breaker.on_failure(7.5, "c", probe=True)  # still down
    assert breaker.state is BreakerState.OPEN
    assert breaker.admit(8.0) is Admission.REJECT
    assert breaker.admit(9.5) is Admission.PROBE
    breaker.on_answer(9.6, probe=True)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.admit(9.7) is Admission.PASS
    assert breaker.open_s(9.7) == 0.0


def test_breaker_stays_closed_for_one_failing_blob_or_a_success_in_between() -> None:
    one_blob = CircuitBreaker(open_after_s=5.0)
    failing(one_blob, 0.0, 30.0, ["a"])
    assert one_blob.state is BreakerState.CLOSED
    mixed = CircuitBreaker(open_after_s=5.0)
    for t in range(30):
        failing(mixed, t, t + 0.5, ["a", "b"])
        mixed.on_answer(t + 0.9)
    assert mixed.state is BreakerState.CLOSED
    off = CircuitBreaker(open_after_s=0.0)
    failing(off, 0.0, 60.0, ["a", "b"])
    assert off.state is BreakerState.CLOSED


def test_an_abandoned_probe_lets_the_next_request_probe() -> None:
    breaker = CircuitBreaker(open_after_s=1.0, probe_interval_s=2.0)
    failing(breaker, 0.0, 1.5, ["a", "b"])
    assert breaker.admit(3.5) is Admission.PROBE
    breaker.probe_abandoned()
    assert breaker.admit(3.6) is Admission.PROBE


def test_what_counts_as_congestion() -> None:
    assert is_congestion(Throttled("503", status=503))
    assert is_congestion(TimedOut("slow"))
    assert not is_congestion(StorageUnavailable("reset"))
    assert not is_congestion(CircuitOpen("open"))


# -- the controller over a store --------------------------------------------------------------


@pytest.fixture
def store() -> FaultyStorageClient:
    mem = InMemoryStorageClient()
    for i in range(8):
        mem.put(f"f{i}", bytes([i]) * 100)
    return FaultyStorageClient(mem)


def stack(
    store: FaultyStorageClient, config: FlowConfig, retries: int = 3
) -> tuple[RetryingStorageClient, FlowController]:
    flow = FlowController("acct", config)
    client = RetryingStorageClient(
        FlowControlledStorageClient(store, flow),
        retries=retries,
        pacer=flow,
        rng=random.Random(0),
    )
    return client, flow


async def test_a_retry_after_is_honoured_by_every_request_of_the_account(
    store: FaultyStorageClient, autojump_clock: trio.abc.Clock
) -> None:
    client, flow = stack(store, FlowConfig(max_in_flight=4))
    etag = (await store.inner.get_properties("f1")).etag
    store.fail_next("get_range", 1, Throttled("503", status=503, retry_after_s=3.0))
    with pytest.raises(StorageUnavailable):
        await RetryingStorageClient(FlowControlledStorageClient(store, flow), retries=0).get_range(
            "f0", etag, 0, 1
        )
    started = trio.current_time()
    # another blob, another reader, never throttled itself: it still waits for the pause
    assert await client.get_properties("f1") is not None
    assert trio.current_time() - started == pytest.approx(3.0)
    stats = flow.statistics()
    assert stats.throttled == 1
    assert stats.limit_cuts == 1
    assert stats.in_flight_limit == 2
    assert stats.queued_s == pytest.approx(3.0)


async def test_the_limit_bounds_requests_in_flight(
    store: FaultyStorageClient, autojump_clock: trio.abc.Clock
) -> None:
    most = 0
    running = 0

    class Slow(InMemoryStorageClient):
        async def get_properties(self, name: str):  # type: ignore[no-untyped-def]
            nonlocal most, running
            running += 1
            most = max(most, running)
            await trio.sleep(1)
            running -= 1
            return await store.inner.get_properties(name)

    flow = FlowController("acct", FlowConfig(max_in_flight=3))
    client = FlowControlledStorageClient(Slow(), flow)
    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(client.get_properties, f"f{i}")
    assert most == 3
    assert trio.current_time() == pytest.approx(3.0)  # 8 requests, 3 at a time, 1 s each
    assert flow.statistics().in_flight == 0


async def test_when_everything_fails_new_reads_fail_at_once_then_one_probe_lets_them_back(
    store: FaultyStorageClient, autojump_clock: trio.abc.Clock
) -> None:
    client, flow = stack(store, FlowConfig(max_in_flight=8, breaker_open_after_s=5.0), retries=2)
    etags = {f"f{i}": (await store.inner.get_properties(f"f{i}")).etag for i in range(8)}
    store.fail_next("get_range", 10_000, lambda: StorageUnavailable("connection refused"))
    t = 0
    while flow.breaker_state is BreakerState.CLOSED:
        with pytest.raises(StorageUnavailable):
            await client.get_range(f"f{t % 8}", etags[f"f{t % 8}"], 0, 1)
        t += 1
        assert trio.current_time() < 30
    sent = store.calls["get_range"]
    fast = flow.statistics().fast_failures
    started = trio.current_time()
    with pytest.raises(CircuitOpen):
        await client.get_range("f3", etags["f3"], 0, 1)
    assert trio.current_time() == started  # failed at once, unsent
    assert store.calls["get_range"] == sent
    # storage is back; within a probe interval a read is the probe and lets traffic back in
    store.clear_faults()
    await trio.sleep(2.0)
    assert await client.get_range("f3", etags["f3"], 0, 1) == b"\x03"
    assert flow.breaker_state is BreakerState.CLOSED
    stats = flow.statistics()
    assert stats.breaker_opened == 1
    assert stats.fast_failures == fast + 1
    assert stats.breaker_open_s == 0.0


async def test_permanent_errors_are_answers_and_cancellation_frees_the_slot(
    store: FaultyStorageClient, autojump_clock: trio.abc.Clock
) -> None:
    flow = FlowController("acct", FlowConfig(max_in_flight=1))
    client = FlowControlledStorageClient(store, flow)
    with pytest.raises(BlobNotFound):
        await client.get_properties("missing")
    with trio.move_on_after(0.5):

        class Hang(InMemoryStorageClient):
            async def get_properties(self, name: str):  # type: ignore[no-untyped-def]
                await trio.sleep_forever()

        await FlowControlledStorageClient(Hang(), flow).get_properties("f0")
    assert flow.statistics().in_flight == 0
    assert (await client.get_properties("f0")).size == 100  # the one slot is free again


async def test_one_controller_per_account_in_a_run() -> None:
    a = account_flow("acct", FlowConfig(max_in_flight=4))
    assert account_flow("acct", FlowConfig(max_in_flight=9)) is a
    assert account_flow("other", FlowConfig()) is not a


async def test_flow_control_off_sends_everything_at_once(
    store: FaultyStorageClient, autojump_clock: trio.abc.Clock
) -> None:
    client, flow = stack(store, FlowConfig(enabled=False, max_in_flight=1))
    store.fail_next("get_properties", 1, Throttled("503", status=503, retry_after_s=5.0))
    await client.get_properties("f0")
    assert flow.statistics().in_flight_limit == 1
    assert flow.statistics().throttled == 1
    assert flow.pause_remaining() == 0.0


# -- the controller against simulated servers -------------------------------------------------


@dataclass
class SimServer(InMemoryStorageClient):
    """A store over its targets, as issue #27's proxies: it admits `per_second` requests in each
    second (a fixed window) and/or `max_in_flight` at once, and answers the rest 503 after
    `refuse_s`; an admitted request takes `latency_s` (±30%)."""

    latency_s: float = 0.01
    per_second: int | None = None
    max_in_flight: int | None = None
    refuse_s: float = 0.0
    refuse_share: float = 0.0  # refused at random, whatever the load
    ok: list[float] = field(default_factory=list)
    refused: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()
        self._rng = random.Random(1)
        self._window = -1
        self._admitted = 0
        self._in_flight = 0

    def _busy(self, now: float) -> bool:
        if self._rng.random() < self.refuse_share:
            return True
        if self.max_in_flight is not None and self._in_flight >= self.max_in_flight:
            return True
        if self.per_second is not None:
            if math.floor(now) != self._window:
                self._window, self._admitted = math.floor(now), 0
            if self._admitted >= self.per_second:
                return True
            self._admitted += 1
        return False

    async def get_range(self, name: str, etag: str, start: int, length: int) -> bytes:
        now = trio.current_time()
        if self._busy(now):
            self.refused.append(now)
            await trio.sleep(self.refuse_s)
            raise Throttled("503 ServerBusy", status=503)
        self._in_flight += 1
        try:
            await trio.sleep(self.latency_s * self._rng.uniform(0.7, 1.3))
        finally:
            self._in_flight -= 1
        self.ok.append(trio.current_time())
        return b"x"


@dataclass(frozen=True)
class SimResult:
    ok_per_s: float  # successes a second over the second half
    sent_per_ok: float  # requests sent per success over the second half
    mean_limit: float  # the in-flight limit over the second half
    gave_up: int  # reads that failed after every retry


async def drive(
    server: SimServer, *, readers: int = 16, ceiling: int = 32, seconds: float = 20.0
) -> SimResult:
    """`readers` readers read as fast as they can through the retry layer and the flow
    controller for `seconds`; figures from the second half (the first is for settling)."""
    flow = FlowController("acct", FlowConfig(max_in_flight=ceiling))
    client = RetryingStorageClient(
        FlowControlledStorageClient(server, flow), pacer=flow, rng=random.Random(0)
    )
    half = trio.current_time() + seconds / 2
    end = trio.current_time() + seconds
    limits: list[int] = []
    gave_up = 0

    async def reader() -> None:
        nonlocal gave_up
        while trio.current_time() < end:
            try:
                await client.get_range("f", "etag", 0, 1)
            except StorageUnavailable:
                gave_up += 1

    async def sample() -> None:
        while trio.current_time() < end:
            await trio.sleep(0.05)
            if trio.current_time() >= half:
                limits.append(flow.statistics().in_flight_limit)

    async with trio.open_nursery() as nursery:
        for _ in range(readers):
            nursery.start_soon(reader)
        nursery.start_soon(sample)
    ok = sum(1 for t in server.ok if half <= t < end)
    refused = sum(1 for t in server.refused if half <= t < end)
    return SimResult(
        ok_per_s=ok / (end - half),
        sent_per_ok=(ok + refused) / max(1, ok),
        mean_limit=sum(limits) / len(limits),
        gave_up=gave_up,
    )


@pytest.mark.parametrize(
    ("per_second", "latency_s", "refuse_s"),
    [
        (200, 0.01, 0.0),  # the benchmark's throttle: 503s at once
        (200, 0.01, 0.01),  # ... and 503s as late as answers (the delay proxy)
        (200, 0.02, 0.0),
        (1000, 0.005, 0.0),
        (100, 0.05, 0.05),
        # answers faster than the rate: one request at a time (500 a second) is over it, as
        # with Azurite on loopback behind the benchmark's throttle
        (200, 0.002, 0.0),
        (100, 0.001, 0.0),
    ],
)
async def test_a_rate_limited_server_gets_nearly_its_rate_with_few_refusals(
    per_second: int, latency_s: float, refuse_s: float, autojump_clock: trio.abc.Clock
) -> None:
    """Issue #27's throttle: a server admitting R requests a second. The controller must not
    read its refusals as "too many in flight" again and again (the limit fell to 1-2, so at
    10-20 ms a request the client got 50-100 a second of 200)."""
    server = SimServer(latency_s=latency_s, per_second=per_second, refuse_s=refuse_s)
    got = await drive(server)
    print(got)
    assert got.ok_per_s >= 0.8 * per_second
    assert got.sent_per_ok <= 1.15
    assert got.gave_up == 0


@pytest.mark.parametrize(
    ("n", "latency_s", "refuse_s"), [(3, 0.005, 0.0), (5, 0.01, 0.01), (8, 0.02, 0.0)]
)
async def test_a_server_refusing_beyond_n_in_flight_settles_near_n(
    n: int, latency_s: float, refuse_s: float, autojump_clock: trio.abc.Clock
) -> None:
    server = SimServer(latency_s=latency_s, max_in_flight=n, refuse_s=refuse_s)
    got = await drive(server)
    print(got)
    assert n - 1 <= got.mean_limit <= n + 0.5
    assert got.sent_per_ok < 1.05  # under 5% refused
    assert got.ok_per_s >= 0.8 * n / latency_s
    assert got.gave_up == 0


async def test_refusals_that_do_not_ease_as_the_client_slows_do_not_starve_it(
    autojump_clock: trio.abc.Clock,
) -> None:
    """30% of requests refused at random, without a Retry-After: slowing down does not help, so
    the send rate stays at least what one request at a time sends (1 / latency)."""
    server = SimServer(latency_s=0.005, refuse_share=0.3)
    got = await drive(server, readers=8, ceiling=8, seconds=10.0)
    print(got)
    assert got.ok_per_s >= 0.7 * 0.7 / 0.005
