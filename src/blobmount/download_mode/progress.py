"""Showing a download's progress: a tqdm bar on a terminal, periodic log lines otherwise, and
the summary at the end (text or JSON).

Reporters only read `DownloadStats` snapshots, sampled by `report_progress`; the downloader
knows nothing about terminals.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Callable
from typing import IO, Any, Protocol

import trio

from blobmount.download_mode.downloader import DownloadResult, DownloadStats
from blobmount.progress import LOG_INTERVAL_S, ByteBar, ProgressLog, rate_text
from blobmount.units import format_size

log = logging.getLogger(__name__)

#: how often the bar is redrawn
BAR_INTERVAL_S = 0.25
#: failures listed in the text summary (all of them are in --json, up to the detail limit)
SUMMARY_FAILURES = 50


class Reporter(Protocol):
    def update(self, stats: DownloadStats) -> None: ...

    def close(self, stats: DownloadStats) -> None: ...


def _files(stats: DownloadStats) -> str:
    more = "" if stats.listing_done else "+"
    text = f"{stats.files_fetched}/{stats.files_queued}{more} files"
    if stats.files_skipped:
        text += f", {stats.files_skipped} current"
    if stats.failed:
        text += f", {stats.failed} failed"
    return text


class BarReporter:
    """A tqdm bar of bytes (total grows while the listing runs), files in the postfix."""

    def __init__(self, stream: IO[str]) -> None:
        self._bar = ByteBar(stream, "download", mininterval=BAR_INTERVAL_S)

    def update(self, stats: DownloadStats) -> None:
        listing = "" if stats.listing_done else ", listing"
        self._bar.show(stats.bytes_received, stats.bytes_queued, _files(stats) + listing)

    def close(self, stats: DownloadStats) -> None:
        self.update(stats)
        self._bar.close()


class LogReporter(ProgressLog[DownloadStats]):
    """One INFO line every `interval_s`: files, bytes, throughput of the last interval, ETA."""

    def __init__(
        self, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(log, lambda s: s.bytes_received, progress_line, interval_s, clock)


def progress_line(stats: DownloadStats, bytes_per_s: float) -> str:
    text = (
        f"{_files(stats)}, {format_size(stats.bytes_received)} of "
        f"{format_size(stats.bytes_queued)}{'' if stats.listing_done else '+'}, "
        f"{format_size(int(bytes_per_s))}/s"
    )
    if not stats.listing_done:
        return text + ", listing"
    remaining = max(0, stats.bytes_queued - stats.bytes_received)
    average = stats.bytes_received / stats.elapsed_s if stats.elapsed_s > 0 else 0.0
    if average > 0:
        eta = int(remaining / average)
        text += f", ETA {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}"
    return text


def make_reporter(stream: IO[str] | None = None, *, enabled: bool = True) -> Reporter | None:
    """A bar when `stream` (default stderr) is a terminal, log lines otherwise."""
    if not enabled:
        return None
    stream = stream or sys.stderr
    if stream.isatty():
        return BarReporter(stream)
    return LogReporter()


async def report_progress(
    read: Callable[[], DownloadStats], reporter: Reporter, interval_s: float = BAR_INTERVAL_S
) -> None:
    """Feed `reporter` a snapshot every `interval_s` until cancelled."""
    while True:
        reporter.update(read())
        await trio.sleep(interval_s)


# -- the end ---------------------------------------------------------------------------------


def summary_lines(result: DownloadResult, *, interrupted: str | None = None) -> list[str]:
    """The human summary: what was copied, how fast, and every failure (up to a limit)."""
    s = result.stats
    lines = []
    head = (
        f"downloaded {s.files_fetched} files ({format_size(s.bytes_fetched)}) "
        f"in {s.elapsed_s:.1f} s ({rate_text(s.bytes_fetched, s.elapsed_s)})"
    )
    extras = []
    if s.files_skipped:
        extras.append(f"{s.files_skipped} already current ({format_size(s.bytes_skipped)})")
    if s.folders:
        extras.append(f"{s.folders} folder markers")
    if s.filtered:
        extras.append(f"{s.filtered} filtered out")
    if s.md5_verified or s.md5_missing:
        extras.append(f"Content-MD5 checked on {s.md5_verified}, missing on {s.md5_missing}")
    lines.append(head + ("; " + "; ".join(extras) if extras else ""))
    if interrupted:
        left = s.files_queued - s.files_fetched - s.failed
        lines.append(
            f"interrupted by {interrupted}: {max(0, left)} listed files not downloaded"
            + ("" if s.listing_done else " (listing incomplete)")
            + "; run the same command again to resume"
        )
    if result.fatal:
        lines.append(result.fatal)
    if s.failed:
        lines.append(f"{s.failed} blobs failed:")
        shown = result.failures[:SUMMARY_FAILURES]
        lines.extend(f"  {f.blob}: {f.reason}" for f in shown)
        if s.failed > len(shown):
            lines.append(f"  ... and {s.failed - len(shown)} more (see the log or --json)")
    return lines


def summary_json(
    result: DownloadResult, *, interrupted: str | None = None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "ok": result.ok and interrupted is None,
        "interrupted": interrupted,
        "fatal": result.fatal,
        "stats": dataclasses.asdict(result.stats),
        "failures": [{"blob": f.blob, "reason": f.reason} for f in result.failures],
        **(extra or {}),
    }
