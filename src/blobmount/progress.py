"""Progress of a long command on stderr, shared by `download` and `warm`: a tqdm bar of bytes
on a terminal, a log line every few seconds otherwise (a bar in a log file is noise)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import IO, Any, Generic, TypeVar, cast

from tqdm import tqdm  # type: ignore[import-untyped]
from tqdm.contrib.logging import logging_redirect_tqdm  # type: ignore[import-untyped]

from blobmount.units import format_size

#: how often a progress log line is written when not on a terminal
LOG_INTERVAL_S = 10.0

S = TypeVar("S")


def rate_text(n_bytes: float, seconds: float) -> str:
    return f"{format_size(int(n_bytes / seconds)) if seconds > 0 else '0 B'}/s"


class ByteBar:
    """A tqdm bar of bytes whose total may grow (while a listing runs); the postfix says the
    rest (files, state)."""

    def __init__(self, stream: IO[str], desc: str, mininterval: float = 0.1) -> None:
        self._bar: Any = tqdm(
            total=0,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            dynamic_ncols=True,
            file=stream,
            desc=desc,
            mininterval=mininterval,
        )
        self._shown = 0

    def show(self, done: int, total: int, postfix: str) -> None:
        self._bar.total = max(total, done)
        self._bar.set_postfix_str(postfix, refresh=False)
        self._bar.update(done - self._shown)
        self._shown = done

    def close(self) -> None:
        self._bar.close()


class ProgressLog(Generic[S]):
    """One INFO line every `interval_s`, made by `line(snapshot, bytes per second since the
    last line)`; `done_bytes(snapshot)` is the byte counter the rate is taken from."""

    def __init__(
        self,
        logger: logging.Logger,
        done_bytes: Callable[[S], int],
        line: Callable[[S, float], str],
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log, self._done_bytes, self._line = logger, done_bytes, line
        self._interval_s = interval_s
        self._clock = clock
        self._last: tuple[float, int] | None = None

    def update(self, snapshot: S) -> None:
        now, done = self._clock(), self._done_bytes(snapshot)
        if self._last is None:
            self._last = (now, done)
            return
        t0, b0 = self._last
        if now - t0 < self._interval_s:
            return
        self._last = (now, done)
        self._log.info("progress: %s", self._line(snapshot, (done - b0) / (now - t0)))

    def close(self, *_: object) -> None:
        pass


def logging_around(drawing: bool) -> AbstractContextManager[Any]:
    """While a bar is drawn, log lines go through tqdm so they do not tear it."""
    if not drawing:
        return nullcontext()
    return cast(AbstractContextManager[Any], logging_redirect_tqdm())
