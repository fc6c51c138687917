"""CircuitBreaker: when storage has failed every request for a while, stop sending and fail at
once; one probe request at a time finds out when it answers again (pure: the caller passes the
time; storage/flow.py drives it).

    closed ──every request failed for open_after_s, ≥ min_failures, on ≥ 2 blobs──► open
    open ──probe_interval_s later, the next request is let through as the probe──► half-open
    half-open ──the probe got an answer──► closed;  ──the probe failed──► open

Only transient failures (StorageUnavailable) count; any answer from storage (even 404 or 412)
is a sign of life. Failures must span at least two blobs (or listings): Azure throttles by
partition, and one blob that keeps failing is that blob's trouble, not a reason to fail reads of
every other blob.
"""

from __future__ import annotations

import enum
import logging
import math
from typing import Protocol

log = logging.getLogger(__name__)

#: seconds of nothing but failures before the breaker opens (DATASET_MOUNT_BREAKER_SECONDS)
OPEN_AFTER_S = 5.0
#: failures in a row it takes, whatever the time
MIN_FAILURES = 4
#: seconds between probes while open
PROBE_INTERVAL_S = 2.0


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


class Admission(enum.Enum):
    PASS = "pass"  # send it
    PROBE = "probe"  # send it: it is the one request that finds out whether storage is back
    REJECT = "reject"  # fail it at once


class FailureRun:
    """The current run of transient failures, and whether it says storage is down: nothing but
    failures for `open_after_s`, at least `min_failures` of them, for at least two keys."""

    def __init__(self, open_after_s: float, min_failures: int = MIN_FAILURES) -> None:
        self.open_after_s = open_after_s  # 0 or less: never says so
        self._min_failures = min_failures
        self.reset()

    def reset(self) -> None:
        """An answer came (or the breaker opened): a new run starts at the next failure."""
        self.failures = 0
        self.first_at = math.inf
        self._first_key: str | None = None
        self._keys_differ = False

    def add(self, now: float, key: str) -> bool:
        """Count a failure of a request for `key`; True when the run now says storage is down."""
        if self.failures == 0:
            self.first_at = now
            self._first_key = key
        elif key != self._first_key:
            self._keys_differ = True
        self.failures += 1
        return (
            self.open_after_s > 0
            and self._keys_differ
            and self.failures >= self._min_failures
            and now - self.first_at >= self.open_after_s
        )

    def log_opened(self, now: float) -> None:
        log.warning(
            "storage failed all %d requests of the last %.1fs: new reads fail at once "
            "(EIO) until a probe request gets an answer",
            self.failures,
            now - self.first_at,
        )


def log_closed(open_for_s: float) -> None:
    log.warning("storage answers again after %.1fs: requests go through again", open_for_s)


class Breaker(Protocol):
    """What the flow controller drives: this module's `CircuitBreaker`, or the one breaker of
    a multi-process mount (storage/shared_flow.py). Times are the caller's clock, in seconds."""

    @property
    def state(self) -> BreakerState: ...

    @property
    def opened(self) -> int: ...

    def open_s(self, now: float) -> float: ...

    def rejects(self, now: float) -> bool: ...

    def admit(self, now: float) -> Admission: ...

    def on_answer(self, now: float, *, probe: bool = False) -> None: ...

    def probe_abandoned(self) -> None: ...

    def on_failure(self, now: float, key: str, *, probe: bool = False) -> None: ...


class CircuitBreaker:
    """The breaker's state machine; times are the caller's clock in seconds."""

    def __init__(
        self,
        *,
        open_after_s: float = OPEN_AFTER_S,
        min_failures: int = MIN_FAILURES,
        probe_interval_s: float = PROBE_INTERVAL_S,
    ) -> None:
        self._run = FailureRun(open_after_s, min_failures)
        self._probe_interval_s = probe_interval_s
        self.state = BreakerState.CLOSED
        self.opened = 0  # times it opened
        self._opened_at = math.inf
        self._next_probe_at = math.inf
        self._probing = False

    def open_s(self, now: float) -> float:
        """How long it has been open (half-open counts as open); 0 when closed."""
        return 0.0 if self.state is BreakerState.CLOSED else max(0.0, now - self._opened_at)

    def rejects(self, now: float) -> bool:
        """Whether a request arriving now would be refused (without taking the probe)."""
        if self.state is BreakerState.CLOSED:
            return False
        return self._probing or now < self._next_probe_at

    def admit(self, now: float) -> Admission:
        if self.state is BreakerState.CLOSED:
            return Admission.PASS
        if self._probing or now < self._next_probe_at:
            return Admission.REJECT
        self.state = BreakerState.HALF_OPEN
        self._probing = True
        return Admission.PROBE

    def on_answer(self, now: float, *, probe: bool = False) -> None:
        """Storage answered a request (success or a permanent error)."""
        self._run.reset()
        if self.state is BreakerState.CLOSED:
            return
        if probe or self.state is BreakerState.HALF_OPEN:
            log_closed(now - self._opened_at)
            self.state = BreakerState.CLOSED
            self._probing = False
            self._opened_at = self._next_probe_at = math.inf

    def probe_abandoned(self) -> None:
        """The probe ended without an answer either way (cancelled): the next request probes."""
        if self._probing:
            self._probing = False
            self.state = BreakerState.OPEN
            self._next_probe_at = -math.inf

    def on_failure(self, now: float, key: str, *, probe: bool = False) -> None:
        """A request failed transiently; `key` names what it was for (a blob, a listing)."""
        if probe or self.state is BreakerState.HALF_OPEN:
            self._probing = False
            self.state = BreakerState.OPEN
            self._next_probe_at = now + self._probe_interval_s
            return
        if self.state is BreakerState.OPEN:
            return  # a request sent before it opened
        if self._run.add(now, key):
            self.state = BreakerState.OPEN
            self.opened += 1
            self._opened_at = now
            self._next_probe_at = now + self._probe_interval_s
            self._run.log_opened(now)
