"""What a transient storage failure says about load: the exceptions the flow controller reads.

All three are `StorageUnavailable`, so everything that handles transient failures (the errno
table, the retry layer, the counters) treats them as before; only the flow controller and the
retry layer look closer:

- `Throttled`: storage answered that it is over its targets (503 ServerBusy, 500
  OperationTimedOut, 429): send less;
- `TimedOut`: no complete answer in time, which an overloaded server also looks like;
- `CircuitOpen`: no request was sent at all, because storage has failed every request for a
  while (storage/breaker.py); not worth retrying.
"""

from __future__ import annotations

import logging

from blobmount.errors import StorageUnavailable

log = logging.getLogger(__name__)

#: the statuses with which Azure asks a client to back off
THROTTLE_STATUSES = frozenset({429, 500, 503})


class Throttled(StorageUnavailable):
    """Storage answered 503, 500 or 429: it is over an account or partition target."""

    def __init__(
        self, message: str, *, status: int | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.status = status  # None when rebuilt from a message alone


class TimedOut(StorageUnavailable):
    """No complete answer within a timeout or the call's deadline."""


class CircuitOpen(StorageUnavailable):
    """Failed at once, without a request: storage has failed every request for a while."""


def is_congestion(exc: BaseException) -> bool:
    """Whether `exc` is storage asking for less (the in-flight limit shrinks on it)."""
    return isinstance(exc, Throttled | TimedOut)


def add_request_id(exc: BaseException, request_id: str) -> None:
    """Name the request in `exc`'s message (once), so a user can hand it to Azure support."""
    if exc.args and isinstance(exc.args[0], str) and request_id not in exc.args[0]:
        exc.args = (f"{exc.args[0]} [client request id {request_id}]", *exc.args[1:])
