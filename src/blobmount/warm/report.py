"""What `blobmount warm` shows: a tqdm bar on a terminal, a log line every few seconds
otherwise (as `blobmount download` does), and the summary at the end, as text or JSON."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from blobmount.progress import ByteBar, ProgressLog, rate_text
from blobmount.units import format_size
from blobmount.warm.budget import Mode
from blobmount.warm.warmer import Progress, WarmResult

log = logging.getLogger(__name__)

SUMMARY_FAILURES = 50


def _files(p: Progress) -> str:
    more = "" if p.listing_done else "+"
    text = f"{p.files_done}/{p.files_listed}{more} files"
    return text + (", waiting for disk writes" if p.throttled else "")


class BarReporter:
    """A tqdm bar of bytes; its total grows while the tree is listed."""

    def __init__(self, stream: IO[str]) -> None:
        self._bar = ByteBar(stream, "warm")

    def update(self, p: Progress) -> None:
        self._bar.show(p.bytes_done, p.bytes_listed, _files(p))

    def close(self) -> None:
        self._bar.close()


def _log_line(p: Progress, bytes_per_s: float) -> str:
    total = format_size(p.bytes_listed) + ("" if p.listing_done else "+")
    return f"{_files(p)}, {format_size(p.bytes_done)} of {total}, {rate_text(bytes_per_s, 1)}"


Reporter = BarReporter | ProgressLog[Progress]


def make_reporter(enabled: bool, stream: IO[str] | None = None) -> Reporter | None:
    """A bar when `stream` (default stderr) is a terminal, a log line every few seconds
    otherwise."""
    if not enabled:
        return None
    stream = stream or sys.stderr
    return BarReporter(stream) if stream.isatty() else log_reporter()


def log_reporter(clock: Callable[[], float] = time.monotonic) -> ProgressLog[Progress]:
    return ProgressLog(log, lambda p: p.bytes_done, _log_line, clock=clock)


# -- the summary -------------------------------------------------------------------------------


def from_storage(r: WarmResult) -> int:
    """Bytes the mount fetched while warming (other readers of the mount included)."""
    return max(0, r.last.storage_bytes - r.first.storage_bytes)


def already_cached_files(r: WarmResult) -> int:
    """Whole-file mode: files whose open found them cached. Block mode cannot tell cheaply
    for each file, only for those it checks before reading at the cache's limit."""
    if r.mode is not Mode.WHOLE_FILE:
        return r.found_cached
    return max(0, r.last.cached_opens - r.first.cached_opens)


def summary_lines(r: WarmResult) -> list[str]:
    last = r.last
    fetched = from_storage(r)
    if r.mode is Mode.WHOLE_FILE:
        cached = f"{already_cached_files(r)} files were already cached"
    else:
        cached = f"about {format_size(max(0, r.bytes - fetched))} of it was already cached"
        if r.found_cached:
            cached += f"; {r.found_cached} files found cached were not read again"
    lines = [
        f"warmed {r.files} files ({format_size(r.bytes)}) in {r.seconds:.1f} s "
        f"({rate_text(r.bytes, r.seconds)}); {format_size(fetched)} from storage, {cached}"
    ]
    cache = (
        f"{format_size(last.used_bytes)} of {format_size(last.capacity_bytes)}, pruning "
        f"starts at {format_size(last.prune_start_bytes)}"
    )
    if r.cache_full:
        lines.append(
            f"the cache is full: stopped before {r.stopped_before}, which would have taken it "
            f"past the point where pruning starts and evicts what was warmed ({cache})"
        )
    else:
        lines.append(f"cache {cache} ({r.mode} mode)")
    if r.too_large:
        lines.append(
            f"{len(r.too_large)} files left out, each too large to cache without pruning "
            f"(the first: {r.too_large[0]})"
        )
    lost = last.not_written_blocks - r.first.not_written_blocks
    if lost > 0:
        lines.append(f"{lost} blocks were not written to disk (queue full, no space or errors)")
    streamed = last.not_cached_files - r.first.not_cached_files
    if streamed > 0:
        lines.append(f"{streamed} opens could not be cached and streamed instead (see the log)")
    if r.queue_left:
        lines.append(f"{r.queue_left} blocks were still waiting to be written to disk")
    if r.interrupted:
        lines.append(
            f"interrupted by {r.interrupted}; run the same command again to go on "
            "(what is cached is read from the cache)"
        )
    if r.failures:
        lines.append(f"{len(r.failures)} files or folders failed:")
        lines.extend(f"  {f.path}: {f.reason}" for f in r.failures[:SUMMARY_FAILURES])
        if len(r.failures) > SUMMARY_FAILURES:
            lines.append(f"  ... and {len(r.failures) - SUMMARY_FAILURES} more (see --json)")
    return lines


def summary_json(r: WarmResult, *, mountpoint: str, source: str) -> dict[str, Any]:
    last = r.last
    return {
        "ok": r.ok,
        "interrupted": r.interrupted,
        "mountpoint": mountpoint,
        "source": source,
        "mode": str(r.mode),
        "files": r.files,
        "bytes": r.bytes,
        "seconds": r.seconds,
        "bytes_per_s": r.bytes / r.seconds if r.seconds > 0 else 0.0,
        "bytes_from_storage": from_storage(r),
        "files_already_cached": already_cached_files(r),
        "cache_full": r.cache_full,
        "stopped_before": r.stopped_before,
        "too_large": r.too_large,
        "blocks_not_written": last.not_written_blocks - r.first.not_written_blocks,
        "blocks_left_in_queue": r.queue_left,
        "cache": {
            "used_bytes": last.used_bytes,
            "capacity_bytes": last.capacity_bytes,
            "prune_start_bytes": last.prune_start_bytes,
        },
        "failures": [{"path": f.path, "reason": f.reason} for f in r.failures],
    }
