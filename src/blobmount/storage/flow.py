"""FlowController: one per storage account, shared by every request to it. It decides when a
request may be sent:

1. not while the breaker is open (storage/breaker.py): then it fails at once with CircuitOpen;
2. not before a Retry-After that storage sent to any request of the account has passed;
3. not faster than the send rate, while storage throttles by rate (`SendRate`, storage/aimd.py);
4. only with a slot: at most `limit` requests in flight, the adaptive limit of storage/aimd.py.

and learns from each answer (`Sent.answered`, `Sent.failed`):

- a success feeds `Served` (how many per second, how many in flight on average) and may grow
  the limit;
- a timeout cuts the limit (an overloaded server gets slower: fewer at once);
- a throttle without a Retry-After (503, 500, 429) cuts the limit, but not below the concurrency
  recent successes needed; one that comes while the limit is at that floor already is a rate
  throttle, and cuts the send rate instead (storage/aimd.py says why);
- a Retry-After pauses the whole account; the limit is cut as above, the send rate left alone
  (storage said itself when to come back).

Waiting for the send rate and a slot is bounded together (`max_queue_wait_s`): past it the
request goes anyway, so a queue behind stalled requests cannot stretch a read beyond its bound.

Controllers are kept per account in a trio RunVar (`account_flow`): every storage stack opened
in one process (one trio run) on the same account shares one. The processes of a multi-process
mount also share the breaker and the Retry-After pause (storage/shared_flow.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import trio

from blobmount.storage.aimd import InFlightLimit, SendRate, Served
from blobmount.storage.breaker import Admission, Breaker, BreakerState, CircuitBreaker
from blobmount.storage.overload import CircuitOpen, Throttled, TimedOut, is_congestion
from blobmount.storage.shared_flow import SharedBreaker, SharedFlow

log = logging.getLogger(__name__)

#: requests the send rate lets go at once after an idle spell
BURST = 2.0


@dataclass(frozen=True, slots=True)
class FlowConfig:
    """How one account's requests are paced (built from the settings in compose.storage)."""

    enabled: bool = True
    #: the most requests in flight the limit may allow
    max_in_flight: int = 32
    #: seconds of nothing but failures before new requests fail at once; 0: never
    breaker_open_after_s: float = 5.0
    breaker_probe_interval_s: float = 2.0
    #: the longest an account-wide Retry-After pause is honoured
    max_retry_after_s: float = 60.0
    #: the longest a request waits for a slot before it goes anyway
    max_queue_wait_s: float = 30.0


@dataclass(frozen=True, slots=True)
class FlowStats:
    """What the flow controller of the account has seen and decided."""

    in_flight: int  # requests sent and not answered yet
    in_flight_limit: int  # how many it allows now
    in_flight_limit_max: int  # the most it ever allows
    sent: int  # requests sent to storage (every try of every operation)
    throttled: int  # answers saying storage is over its targets (503, 500, 429)
    timeouts: int  # requests with no complete answer in time
    limit_cuts: int  # times the limit was cut
    send_rate: float  # requests a second allowed while storage throttles by rate; 0: no pacing
    rate_cuts: int  # times the send rate was cut
    queued_s: float  # seconds requests waited, in all, for a slot or a Retry-After pause
    breaker: str  # "closed", "open" or "half-open"
    breaker_open_s: float  # how long it has been open; 0 when closed
    breaker_opened: int  # times it opened
    fast_failures: int  # requests failed at once, unsent, because the breaker was open
    #: throttling refusals retried without using up a retry: storage served others meanwhile
    #: (storage/retry.py)
    refusals_retried: int = 0


class Sent:
    """One request holding a slot: report how it ended exactly once."""

    __slots__ = ("_controller", "_done", "_probe", "_token", "sent_at")

    def __init__(self, controller: FlowController, token: object, probe: bool) -> None:
        self._controller = controller
        self._token = token
        self._probe = probe
        self._done = False
        self.sent_at = trio.current_time()

    def answered(self) -> None:
        """Storage answered (a success, or a permanent error such as 404)."""
        if self._finish():
            self._controller._answered(self._token, self.sent_at, self._probe)

    def failed(self, exc: BaseException, key: str) -> None:
        """A transient failure (StorageUnavailable) of a request for `key`."""
        if self._finish():
            self._controller._failed(self._token, exc, key, self.sent_at, self._probe)

    def abandoned(self) -> None:
        """Cancelled, or ended in something that says nothing about storage."""
        if self._finish():
            self._controller._abandoned(self._token, self._probe)

    def _finish(self) -> bool:
        if self._done:
            return False
        self._done = True
        return True


class FlowController:
    """The flow controller of one storage account (see the module docstring)."""

    def __init__(self, account: str, config: FlowConfig, shared: SharedFlow | None = None) -> None:
        """`shared`: the breaker and pause of a multi-process mount's processes."""
        self.account = account
        self.config = config
        ceiling = max(1, config.max_in_flight)
        self._limit = InFlightLimit(ceiling)
        self._rate = SendRate()
        #: when the latest request storage answered was sent (`answered_since`)
        self._last_answered_sent_at = -math.inf
        self._refusals_retried = 0
        self._served = Served()
        self._next_send = -math.inf  # the send rate's next free moment
        self._slots = trio.CapacityLimiter(ceiling)
        open_after_s = config.breaker_open_after_s
        probe_interval_s = config.breaker_probe_interval_s
        self._breaker: Breaker = (
            CircuitBreaker(open_after_s=open_after_s, probe_interval_s=probe_interval_s)
            if shared is None
            else SharedBreaker(shared, open_after_s=open_after_s, probe_interval_s=probe_interval_s)
        )
        self._shared = shared
        self._paused_until = -math.inf
        self._sent = 0
        self._throttled = 0
        self._timeouts = 0
        self._cuts = 0
        self._rate_cuts = 0
        self._queued_s = 0.0
        self._fast_failures = 0
        self._in_flight = 0

    # -- what callers use ----------------------------------------------------------------

    def refusal_retried(self) -> None:
        self._refusals_retried += 1

    def answered_since(self, when: float) -> bool:
        """Whether storage answered a request of this process's stacks on the account sent at
        `when` or later: it is serving the account."""
        return self._last_answered_sent_at >= when

    def pause_remaining(self) -> float:
        """Seconds until the account's Retry-After pause ends (0 when none)."""
        if self._shared is not None:  # the mount's, set by any of its processes
            return self._shared.pause_remaining()
        return max(0.0, self._paused_until - trio.current_time())

    def _reject(self, what: Callable[[], str]) -> CircuitOpen:
        self._fast_failures += 1
        return CircuitOpen(
            f"{what()}: not sent, storage of {self.account} has failed every request for "
            f"{self._breaker.open_s(trio.current_time()):.0f}s (circuit open)"
        )

    async def acquire(self, what: Callable[[], str]) -> Sent:
        """Wait until a request may be sent; raises CircuitOpen at once while the breaker is
        open. The caller must end the returned `Sent` (answered, failed or abandoned). `what()`
        describes the request, for the rare message about it."""
        if not self.config.enabled:
            return self._hold(object(), probe=False)
        now = trio.current_time()
        if self._breaker.rejects(now):
            raise self._reject(what)
        token = object()
        if (
            self._breaker.state is BreakerState.CLOSED
            and self._slots.available_tokens > 0
            and self.pause_remaining() <= 0
            and self._rate.rate(now) is None
        ):
            # the common case, with nothing to wait for: no cancel scope, no sleep (a
            # checkpoint still lets others run, as a waiting acquire would)
            self._slots.acquire_on_behalf_of_nowait(token)
            await trio.lowlevel.checkpoint()
            return self._hold(token, probe=False)
        started = now
        try:
            # a pause may be pushed back while this one waits: wait until none is left
            while (pause := self.pause_remaining()) > 0:  # noqa: ASYNC110
                await trio.sleep(pause)
            with trio.move_on_after(self.config.max_queue_wait_s) as waited:
                await self._paced()
                await self._slots.acquire_on_behalf_of(token)
            if waited.cancelled_caught:
                token = None  # goes without a slot: storage stalls, a read must not wait more
                log.debug("%s: not sent after %.1fs; sending anyway", what(), self._waited(started))
        finally:
            self._queued_s += trio.current_time() - started
        admission = self._breaker.admit(trio.current_time())
        if admission is Admission.REJECT:
            if token is not None:
                self._slots.release_on_behalf_of(token)
            raise self._reject(what)
        return self._hold(token, probe=admission is Admission.PROBE)

    async def _paced(self) -> None:
        """Wait for this request's turn under the send rate (none while it is off). Each
        request books the next moment, so waiting requests leave evenly spaced."""
        now = trio.current_time()
        rate = self._rate.rate(now)
        if rate is None:
            return
        gap = 1.0 / rate
        # an idle spell earns at most a short burst, not a second's worth at once
        at = max(self._next_send, now - BURST * gap)
        self._next_send = at + gap
        if at > now:
            await trio.sleep_until(at)

    def statistics(self) -> FlowStats:
        now = trio.current_time()
        rate = self._rate.rate(now) if self.config.enabled else None
        return FlowStats(
            in_flight=self._in_flight,
            in_flight_limit=self._limit.limit,
            in_flight_limit_max=self._limit.ceiling,
            sent=self._sent,
            throttled=self._throttled,
            timeouts=self._timeouts,
            limit_cuts=self._cuts,
            send_rate=rate or 0.0,
            rate_cuts=self._rate_cuts,
            queued_s=self._queued_s,
            breaker=self._breaker.state.value,
            breaker_open_s=self._breaker.open_s(now),
            breaker_opened=self._breaker.opened,
            fast_failures=self._fast_failures,
            refusals_retried=self._refusals_retried,
        )

    @property
    def breaker_state(self) -> BreakerState:
        return self._breaker.state

    # -- bookkeeping -----------------------------------------------------------------------

    def _waited(self, started: float) -> float:
        return trio.current_time() - started

    def _hold(self, token: object | None, *, probe: bool) -> Sent:
        self._sent += 1
        self._in_flight += 1
        return Sent(self, token, probe)

    def _release(self, token: object | None) -> None:
        self._in_flight -= 1
        if token is not None and self.config.enabled:
            self._slots.release_on_behalf_of(token)

    def _abandoned(self, token: object | None, probe: bool) -> None:
        self._release(token)
        if probe:
            self._breaker.probe_abandoned()

    def _saturated(self) -> bool:
        # this request's slot is still held: all taken (someone waiting implies that too);
        # not statistics(), which copies the set of borrowers on every call
        return self._slots.borrowed_tokens >= self._limit.limit

    def _answered(self, token: object | None, sent_at: float, probe: bool) -> None:
        now = trio.current_time()
        self._last_answered_sent_at = max(self._last_answered_sent_at, sent_at)
        if self.config.enabled:
            self._served.add(now, now - sent_at)
            self._limit.on_success(now, saturated=self._saturated())
        self._release(token)
        self._apply_limit()
        self._breaker.on_answer(now, probe=probe)

    def _failed(
        self, token: object | None, exc: BaseException, key: str, sent_at: float, probe: bool
    ) -> None:
        self._release(token)
        now = trio.current_time()
        if isinstance(exc, Throttled):
            self._throttled += 1
        elif isinstance(exc, TimedOut):
            self._timeouts += 1
        retry_after = getattr(exc, "retry_after_s", None)
        if self.config.enabled:
            if is_congestion(exc):
                self._push_back(exc, sent_at, now, paused=bool(retry_after))
            if retry_after:
                pause = min(float(retry_after), self.config.max_retry_after_s)
                if self._shared is not None:
                    self._shared.pause_for(pause)
                else:
                    self._paused_until = max(self._paused_until, now + pause)
        self._breaker.on_failure(now, key, probe=probe)

    def _push_back(self, exc: BaseException, sent_at: float, now: float, *, paused: bool) -> None:
        """Storage asked for less: cut the limit, or, when the limit is already no more than
        storage's recent successes needed and no Retry-After says when to come back, the rate."""
        # a timeout is no measure of what storage admits: only throttles keep the floor
        floor = math.ceil(self._served.concurrency(now)) if isinstance(exc, Throttled) else 1
        if self._limit.on_congestion(sent_at, now, floor=floor):
            self._cuts += 1
            self._apply_limit()
            log.info(
                "storage of %s pushes back (%s): at most %d requests in flight",
                self.account,
                type(exc).__name__,
                self._limit.limit,
            )
        elif isinstance(exc, Throttled) and not paused and self._limit.limit <= floor:
            admitted = self._served.rate(now)
            # never slower than one request at a time, the least the limit alone would send:
            # throttling that does not ease as the client slows is not about its rate
            floor_rate = self._served.one_at_a_time(now)
            if self._rate.on_throttled(sent_at, now, admitted, floor=floor_rate):
                self._rate_cuts += 1
                log.info(
                    "storage of %s throttles by rate (%s): at most %.0f requests a second",
                    self.account,
                    type(exc).__name__,
                    self._rate.rate(now) or 0.0,
                )

    def _apply_limit(self) -> None:
        if not self.config.enabled:
            return
        limit = self._limit.limit
        if self._slots.total_tokens != limit:
            self._slots.total_tokens = limit


_FLOWS: trio.lowlevel.RunVar[dict[str, FlowController]] = trio.lowlevel.RunVar("blobmount_flows")


def account_flow(
    account: str, config: FlowConfig, shared: SharedFlow | None = None
) -> FlowController:
    """The flow controller of `account` in this trio run, made with `config` (and `shared`) by
    the first caller (later callers share it, whatever they pass)."""
    try:
        flows = _FLOWS.get()
    except LookupError:
        flows = {}
        _FLOWS.set(flows)
    controller = flows.get(account)
    if controller is None:
        controller = flows[account] = FlowController(account, config, shared)
    return controller
