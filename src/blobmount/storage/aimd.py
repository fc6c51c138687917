"""InFlightLimit: how many requests to one storage account may be in flight, adapted to its
answers (pure: no clock of its own, no I/O; storage/flow.py drives it).

Additive increase, multiplicative decrease, with a memory of where storage pushed back:

- a congestion signal (503, 500, 429, a timeout) halves the limit, at most once per round: the
  answers to requests sent before the last cut describe the old limit, not the new one;
- the level that drew the signal is remembered, and the limit regrows quickly (one more per
  success) only to just below it;
- after `probe_after_s` without a signal it tries one level more; each probe that passes makes
  the next step twice as big and comes twice as soon. A limit cut to 1 by a burst of throttling
  is back at a ceiling of 32 within about 2 probe periods of calm, while a server that refuses
  everything beyond N in flight costs about one refused request per probe period;
- it never leaves [1, ceiling], and it only grows when it was what held requests back.
"""

from __future__ import annotations

import logging
import math

log = logging.getLogger(__name__)

#: the share of the limit kept after a congestion signal
DECREASE = 0.5
#: seconds without a signal before the limit tries a level above the remembered one
PROBE_AFTER_S = 2.0


class InFlightLimit:
    """The adaptive limit; times are the caller's clock in seconds."""

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

    def on_congestion(self, sent_at: float, now: float) -> bool:
        """Storage pushed back on a request sent at `sent_at`. Returns whether the limit was cut
        (not for a request sent before the last cut)."""
        if sent_at < self._last_cut:
            return False
        self._cap = max(1, self.limit - 1)
        self._cap_since = now
        self._step = 1
        self._wait_s = self._probe_after_s
        self._limit = max(1.0, self._limit * self._decrease)
        self._last_cut = now
        return True
