"""The adaptive limits of one storage account's requests, and what they are measured by (pure: no
clock of their own, no I/O; storage/flow.py drives them).

Storage pushes back in two ways, and one knob cannot answer both:

- **too many at once** (a server or a path that can carry N requests at a time): fewer requests
  in flight help at once. `InFlightLimit` is additive increase, multiplicative decrease on the
  number in flight, with a memory of where storage pushed back:

  - a congestion signal halves the limit, at most once per round: the answers to requests sent
    before the last cut describe the old limit, not the new one;
  - the level that drew the signal is remembered, and the limit regrows quickly (one more per
    success) only to just below it;
  - after `probe_after_s` without a signal it tries one level more; each probe that passes makes
    the next step twice as big and come twice as soon. A limit cut to 1 by a burst of
    throttling is back at a ceiling of 32 within about 2 probe periods of calm, while a server
    that refuses everything beyond N in flight costs about one refused request per probe period;
  - it never leaves [floor, ceiling] and only grows when it was what held requests back.

- **too many per second** (Azure's account and partition targets are rates): a rate limiter
  refuses whatever comes after its budget, however few are in flight, so cutting the number in
  flight again and again only starves the client (a fixed one-second window that is spent
  refuses every request for the rest of the second: dozens of "rounds" at 10 ms each). Two
  things stop that:

  - the in-flight limit is never cut below the concurrency that storage's recent successes
    needed (`Served.concurrency`: by Little's law, successes per second times their latency,
    i.e. the mean number of successful requests in flight over the last second). Fewer than that
    cannot carry the rate storage is admitting;
  - a throttle that arrives while the limit is already at that floor is a rate throttle:
    `SendRate` then paces requests at `DECREASE_RATE` times the rate storage admitted over the
    last second, climbs back to that rate over `RAMP_S`, and then probes above it (each probe
    that passes comes twice as soon and raises the rate twice as much), until it holds nothing
    back and is switched off. Cuts do not compound: each is from the measured admitted rate, not
    from the current one, at most one per window (the rest of a spent window refuses whatever
    is sent), and never below the caller's floor (flow.py: one request at a time, for refusals
    that do not ease as the client slows are not about its rate).
"""

from __future__ import annotations

import logging
import math
from collections import deque

log = logging.getLogger(__name__)

#: the share of the limit kept after a congestion signal
DECREASE = 0.5
#: seconds without a signal before the limit tries a level above the remembered one
PROBE_AFTER_S = 2.0
#: seconds of successes `Served` measures (Azure's targets are per second)
WINDOW_S = 1.0
#: the share of the admitted rate a rate throttle leaves the client (the AWS SDKs use 0.7 too)
DECREASE_RATE = 0.7
#: seconds the send rate takes to climb back to the rate storage admitted when it pushed back
RAMP_S = 1.0
#: seconds at the admitted rate before the first probe above it
RATE_PROBE_AFTER_S = 1.0
#: the first probe's raise; each probe that passes doubles it
RATE_PROBE_STEP = 0.25
#: the send rate is switched off once it is this many times the rate where storage pushed back
RATE_OFF_FACTOR = 8.0
#: the lowest send rate, requests a second (the breaker takes over when nothing gets through)
MIN_RATE = 1.0


class Served:
    """What storage's recent successes say: how many per second, and how many were in flight
    on average (Little's law: the sum of their latencies over the window)."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._done: deque[tuple[float, float]] = deque()  # (answered at, latency)
        self._latency_sum = 0.0

    def add(self, answered_at: float, latency_s: float) -> None:
        self._done.append((answered_at, latency_s))
        self._latency_sum += latency_s

    def _prune(self, now: float) -> None:
        while self._done and self._done[0][0] <= now - self.window_s:
            self._latency_sum -= self._done.popleft()[1]
        if not self._done:
            self._latency_sum = 0.0  # no float drift left behind

    def rate(self, now: float) -> float:
        """Successes per second over the window (a young window is divided in full: an
        under-estimate, the safe side)."""
        self._prune(now)
        return len(self._done) / self.window_s

    def one_at_a_time(self, now: float) -> float:
        """Requests a second one request at a time would send: 1 / their mean latency (0 when
        there were none)."""
        self._prune(now)
        if not self._done or self._latency_sum <= 0.0:
            return 0.0
        return len(self._done) / self._latency_sum

    def concurrency(self, now: float) -> float:
        """The mean number of successful requests in flight over the window."""
        self._prune(now)
        return max(0.0, self._latency_sum) / self.window_s


class InFlightLimit:
    """The adaptive limit on requests in flight; times are the caller's clock in seconds."""

    def __init__(
        self,
        ceiling: int,
        *,
        decrease: float = DECREASE,
        probe_after_s: float = PROBE_AFTER_S,
    ) -> None:
        if ceiling < 1:
            raise ValueError("the ceiling must be at least 1")
        if not 0.0 < decrease < 1.0:
            raise ValueError("decrease must be between 0 and 1")
        self.ceiling = ceiling
        self._decrease = decrease
        self._probe_after_s = probe_after_s
        self._limit = float(ceiling)
        #: the level the limit may grow to quickly (below where storage last pushed back)
        self._cap = ceiling
        self._cap_since = -math.inf
        self._step = 1  # how far the next probe raises the cap
        self._wait_s = probe_after_s  # how long the next probe waits
        self._last_cut = -math.inf

    @property
    def limit(self) -> int:
        return max(1, min(self.ceiling, int(self._limit)))

    def on_success(self, now: float, *, saturated: bool) -> None:
        """A request succeeded; `saturated`: the limit was holding requests back (all slots
        taken, or some waiting), the only time growing it means anything."""
        if not saturated:
            return
        if self._limit < self._cap:
            self._limit = min(float(self._cap), self._limit + 1.0)
        elif self._cap < self.ceiling and now - self._cap_since >= self._wait_s:
            self._cap = min(self.ceiling, self._cap + self._step)
            self._cap_since = now
            self._step *= 2
            self._wait_s /= 2

    def on_congestion(self, sent_at: float, now: float, *, floor: int = 1) -> bool:
        """Storage pushed back on a request sent at `sent_at`. Returns whether the limit was cut
        (not for a request sent before the last cut, nor when it is at `floor` already)."""
        floor = max(1, min(self.ceiling, floor))
        if sent_at < self._last_cut or self.limit <= floor:
            return False
        self._cap = max(floor, self.limit - 1)
        self._cap_since = now
        self._step = 1
        self._wait_s = self._probe_after_s
        self._limit = max(float(floor), self._limit * self._decrease)
        self._last_cut = now
        return True


class SendRate:
    """The rate requests may be sent at after storage throttled by rate; None while off. Times
    are the caller's clock in seconds."""

    def __init__(
        self,
        *,
        decrease: float = DECREASE_RATE,
        ramp_s: float = RAMP_S,
        probe_after_s: float = RATE_PROBE_AFTER_S,
        probe_step: float = RATE_PROBE_STEP,
        off_factor: float = RATE_OFF_FACTOR,
        min_rate: float = MIN_RATE,
        window_s: float = WINDOW_S,
    ) -> None:
        if not 0.0 < decrease < 1.0:
            raise ValueError("decrease must be between 0 and 1")
        self._decrease = decrease
        self._ramp_s = ramp_s
        self._probe_after_s = probe_after_s
        self._probe_step = probe_step
        self._off_factor = off_factor
        self._min_rate = min_rate
        self._window_s = window_s
        self._on = False
        self._admitted = 0.0  # the rate storage admitted when it last pushed back
        self._start = 0.0  # the rate right after the last cut
        self._cut_at = -math.inf
        self._level = 0.0  # the rate reached by probes above `_admitted`
        self._next_probe_at = math.inf
        self._step = probe_step
        self._wait_s = probe_after_s

    @property
    def on(self) -> bool:
        return self._on

    def rate(self, now: float) -> float | None:
        """Requests a second allowed now, or None when nothing is paced."""
        if not self._on:
            return None
        ramped = self._cut_at + self._ramp_s
        if now < ramped:
            share = max(0.0, now - self._cut_at) / self._ramp_s if self._ramp_s > 0 else 1.0
            return self._start + (self._admitted - self._start) * share
        off_at = self._off_factor * self._admitted
        # the waits halve, so the probes end within 2 probe periods: stop at the off level
        while now >= self._next_probe_at and self._level < off_at:
            self._level *= 1.0 + self._step
            self._step *= 2
            self._wait_s /= 2
            self._next_probe_at += self._wait_s
        if self._level >= off_at:
            self._on = False
            log.debug("send rate off: storage admits %.0f/s and more", self._level)
            return None
        return self._level

    def on_throttled(
        self, sent_at: float, now: float, admitted: float, *, floor: float = 0.0
    ) -> bool:
        """Storage refused a request sent at `sent_at` by rate, having admitted `admitted`
        requests a second lately. Returns whether the rate was cut: at most once per window
        (`window_s`), and never to less than `floor` requests a second."""
        # the window storage counted in is spent: it refuses until it ends, however slow we go
        if sent_at < self._cut_at or now - self._cut_at < self._window_s:
            return False
        admitted = max(self._min_rate, floor, admitted)
        self._on = True
        self._admitted = admitted
        self._start = max(self._min_rate, floor, admitted * self._decrease)
        self._cut_at = now
        self._level = admitted
        self._step = self._probe_step
        self._wait_s = self._probe_after_s
        self._next_probe_at = now + self._ramp_s + self._probe_after_s
        return True
