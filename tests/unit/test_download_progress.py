"""Progress reporting and the end-of-run summary."""

from __future__ import annotations

import io
import logging

from blobmount.download_mode.downloader import DownloadResult, DownloadStats, Failure
from blobmount.download_mode.progress import (
    BarReporter,
    LogReporter,
    make_reporter,
    progress_line,
    summary_json,
    summary_lines,
)

MiB = 1024 * 1024


def stats(**kw) -> DownloadStats:
    base = {
        "listed": 10,
        "listing_done": True,
        "files_queued": 8,
        "files_fetched": 8,
        "files_skipped": 2,
        "folders": 1,
        "filtered": 0,
        "failed": 0,
        "bytes_queued": 80 * MiB,
        "bytes_received": 80 * MiB,
        "bytes_fetched": 80 * MiB,
        "bytes_skipped": 2 * MiB,
        "md5_verified": 0,
        "md5_missing": 0,
        "checkpoint_s": 0.1,
        "bytes_direct": 0,
        "elapsed_s": 4.0,
    }
    base.update(kw)
    return DownloadStats(**base)


def test_summary_of_a_clean_run():
    (line,) = summary_lines(DownloadResult(stats(), (), None))
    assert line.startswith("downloaded 8 files (80 MiB) in 4.0 s (20 MiB/s)")
    assert "2 already current (2 MiB)" in line
    assert "1 folder markers" in line


def test_summary_lists_failures_and_interruptions():
    failures = tuple(Failure(f"blob{i}", "HTTP 503") for i in range(60))
    result = DownloadResult(stats(failed=61, files_fetched=3, listing_done=False), failures, None)
    lines = summary_lines(result, interrupted="SIGINT")
    assert "interrupted by SIGINT" in lines[1]
    assert "(listing incomplete)" in lines[1]
    assert "61 blobs failed:" in lines
    assert "  blob0: HTTP 503" in lines
    assert "  blob50: HTTP 503" not in lines
    assert lines[-1] == "  ... and 11 more (see the log or --json)"


def test_summary_json():
    result = DownloadResult(stats(failed=1), (Failure("x", "refused: '..'"),), None)
    data = summary_json(result, extra={"requests": {"range_requests": 0}})
    assert data["ok"] is False
    assert data["failures"] == [{"blob": "x", "reason": "refused: '..'"}]
    assert data["stats"]["files_fetched"] == 8
    assert data["requests"] == {"range_requests": 0}


def test_progress_line_shows_eta_only_once_the_total_is_known():
    listing = progress_line(stats(listing_done=False, bytes_received=10 * MiB), 5 * MiB)
    assert "8/8+ files" in listing
    assert listing.endswith("listing")
    assert "ETA" not in listing
    done = progress_line(stats(bytes_received=40 * MiB, files_fetched=4), 10 * MiB)
    assert "4/8 files, 2 current" in done
    assert "40 MiB of 80 MiB, 10 MiB/s" in done
    assert done.endswith("ETA 0:00:04")  # 40 MiB left at 10 MiB/s on average


def test_log_reporter_writes_a_line_per_interval(caplog):
    now = [0.0]
    reporter = LogReporter(interval_s=10, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="blobmount.download_mode.progress"):
        reporter.update(stats(bytes_received=0))
        now[0] = 5
        reporter.update(stats(bytes_received=10 * MiB))
        assert caplog.records == []
        now[0] = 10
        reporter.update(stats(bytes_received=20 * MiB))
    (record,) = caplog.records
    assert "20 MiB of 80 MiB, 2 MiB/s" in record.getMessage()


def test_bar_reporter_draws_bytes_and_files():
    out = io.StringIO()
    bar = BarReporter(out)
    bar.update(stats(bytes_received=40 * MiB, files_fetched=4))
    bar.close(stats())
    text = out.getvalue()
    assert "download" in text
    assert "8/8 files" in text
    assert "80.0M" in text


def test_reporter_choice():
    assert make_reporter(enabled=False) is None
    assert isinstance(make_reporter(io.StringIO()), LogReporter)  # not a terminal

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    bar = make_reporter(Tty())
    assert isinstance(bar, BarReporter)
    bar.close(stats())
