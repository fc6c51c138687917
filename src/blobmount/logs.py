"""Logging setup: text or JSON lines, secret redaction on every handler, repeats of the same
warning rate-limited, quiet third-party loggers.

Named logs.py (not logging.py) so it never shadows the standard library.
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Values that must never reach a log line, whatever the code that logged them did.
_SECRET_PATTERNS = (
    re.compile(r"(?i)(sig=)[^&\s'\"]+"),
    re.compile(r"(?i)(AccountKey=)[^;\s'\"]+"),
    re.compile(r"(?i)(SharedAccessSignature=)[^;\s'\"]+"),
    re.compile(r"(?i)(Authorization['\"]?\s*[:=]\s*['\"]?)[^'\"\n]+"),
    re.compile(r"(?i)(client_secret=)[^&\s'\"]+"),
)


def redact(text: str) -> str:
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(r"\1***", text)
    return text


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, and exception
    (the traceback) or repeated (a rate-limit summary's count) when present.

    Each text field is redacted before encoding: redacting the encoded line could eat the
    backslash of an escaped quote and break the JSON.
    """

    def format(self, record: logging.LogRecord) -> str:
        created = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        entry: dict[str, object] = {
            "time": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = redact(record.exc_text)
        if record.stack_info:
            entry["stack"] = redact(self.formatStack(record.stack_info))
        repeated = getattr(record, "repeated", None)
        if isinstance(repeated, int):
            entry["repeated"] = repeated
        return json.dumps(entry, ensure_ascii=False)


@dataclass(slots=True)
class _Window:
    start: float
    passed: int = 1
    suppressed: int = 0


class RateLimitFilter(logging.Filter):
    """Lets the first `burst` records of each (logger, level, message template) through per
    `interval_s`, drops the rest, and then sends one summary record ("... repeated K more
    times") to `emit` once the interval is over.

    Only records at `min_level` or above are limited: an error storm (a dead endpoint, a
    throttled account) must not flood the journal, but DEBUG output is asked for on purpose.
    The template, not the formatted text, is the key, so "block 3 failed" and "block 4 failed"
    count as repeats. A summary goes out when any record arrives after the interval has passed,
    and at `flush` (called at exit for the handlers of `setup_logging`). Thread-safe; one
    instance per handler, because a filter shared by two handlers would see every record twice.
    """

    _SUMMARY = "summary"  # attribute name marking our own summary records

    def __init__(
        self,
        emit: Callable[[logging.LogRecord], object],
        *,
        burst: int = 5,
        interval_s: float = 60.0,
        min_level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        if burst < 1 or interval_s <= 0:
            raise ValueError("burst must be >= 1 and interval_s > 0")
        self._emit = emit
        self._burst = burst
        self._interval_s = interval_s
        self._min_level = min_level
        self._clock = clock
        self._windows: dict[tuple[str, int, str], _Window] = {}
        self._next_expiry = float("inf")
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, self._SUMMARY, False):
            return True
        now = self._clock()
        with self._lock:
            summaries = self._expire(now) if now >= self._next_expiry else []
            passed = self._count(record, now)
        # Emitted outside the lock: the handler calls this filter again for each summary.
        for summary in summaries:
            self._emit(summary)
        return passed

    def flush(self) -> None:
        """Send the summaries of every window that dropped something, and forget them all."""
        with self._lock:
            summaries = self._expire(self._clock(), everything=True)
        for summary in summaries:
            self._emit(summary)

    def _count(self, record: logging.LogRecord, now: float) -> bool:
        if record.levelno < self._min_level:
            return True
        key = (record.name, record.levelno, str(record.msg))
        window = self._windows.get(key)
        if window is None:
            self._windows[key] = _Window(start=now)
            self._next_expiry = min(self._next_expiry, now + self._interval_s)
            return True
        if window.passed < self._burst:
            window.passed += 1
            return True
        window.suppressed += 1
        return False

    def _expire(self, now: float, *, everything: bool = False) -> list[logging.LogRecord]:
        summaries = []
        for key, window in list(self._windows.items()):
            if not everything and now - window.start < self._interval_s:
                continue
            del self._windows[key]
            if window.suppressed:
                summaries.append(self._summary(key, window, now))
        starts = [w.start for w in self._windows.values()]
        self._next_expiry = min(starts) + self._interval_s if starts else float("inf")
        return summaries

    def _summary(self, key: tuple[str, int, str], window: _Window, now: float) -> logging.LogRecord:
        name, level, template = key
        elapsed = min(now, window.start + self._interval_s) - window.start
        record = logging.LogRecord(
            name,
            level,
            "",
            0,
            "message repeated %d more times in %.0fs (only the first %d are logged): %s",
            (window.suppressed, elapsed, window.passed, template),
            None,
        )
        setattr(record, self._SUMMARY, True)
        record.repeated = window.suppressed
        return record


FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

# The rate limiters of the handlers setup_logging installed last, flushed at exit.
_limiters: list[tuple[logging.Handler, RateLimitFilter]] = []


@atexit.register  # registered after logging's own hook, so it runs first: handlers still open
def _flush_limiters() -> None:
    root = logging.getLogger()
    for handler, limiter in _limiters:
        stream = getattr(handler, "stream", None)
        if handler not in root.handlers or getattr(stream, "closed", False):
            continue  # replaced since, or its stream is gone: nowhere to write a summary
        limiter.flush()


def setup_logging(
    level: str = "INFO",
    *,
    log_file: Path | None = None,
    stderr: bool = True,
    log_format: str = "text",
) -> None:
    """Log to stderr and/or `log_file`, as text or JSON lines (`log_format` "text" or "json"),
    redacted, with repeated warnings rate-limited."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handlers: list[logging.Handler] = []
    _limiters.clear()
    if stderr:
        handlers.append(logging.StreamHandler(sys.stderr))
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        # a blob name that is not valid Unicode carries lone surrogates: escape them, as
        # stderr does, rather than lose the line that names the blob
        handlers.append(logging.FileHandler(log_file, encoding="utf-8", errors="backslashreplace"))
    for handler in handlers:
        formatter = JsonFormatter() if log_format == "json" else RedactingFormatter(FORMAT)
        handler.setFormatter(formatter)
        limiter = RateLimitFilter(handler.handle)
        handler.addFilter(limiter)
        _limiters.append((handler, limiter))
        root.addHandler(handler)
    root.setLevel(level)
    # The Azure SDK logs every request at INFO (URLs included); keep it to real problems.
    # (blobmount's own request lines are storage.request_log's, at DEBUG; asyncio's DEBUG
    # records only name its event loop's selector.)
    noisy_loggers = (
        "azure",
        "azure.core.pipeline.policies.http_logging_policy",
        "aiohttp",
        "asyncio",
    )
    for noisy in noisy_loggers:
        logging.getLogger(noisy).setLevel(logging.WARNING)
