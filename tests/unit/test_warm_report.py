"""`blobmount warm`'s summary: what it says when the cache filled up, and its JSON."""

from __future__ import annotations

import dataclasses
import io
import logging

from blobmount.progress import ProgressLog
from blobmount.warm.budget import CacheView
from blobmount.warm.reading import Failure
from blobmount.warm.report import (
    BarReporter,
    log_reporter,
    make_reporter,
    summary_json,
    summary_lines,
)
from blobmount.warm.warmer import Progress, WarmResult
from tests.unit.test_warm_budget import MiB, block_snapshot


def result(**kw) -> WarmResult:
    first = CacheView.from_snapshot(block_snapshot({"used_bytes": 10 * MiB}))
    last = dataclasses.replace(
        first, used_bytes=89 * MiB, storage_bytes=first.storage_bytes + 60 * MiB
    )
    r = WarmResult(first.mode, first, last, files=30, bytes=79 * MiB, seconds=2.0)
    for name, value in kw.items():
        setattr(r, name, value)
    return r


def test_a_full_cache_is_said_and_is_not_a_failure():
    r = result(cache_full=True, stopped_before="train/31.bin", too_large=["huge.bin"])
    lines = summary_lines(r)
    assert lines[0].startswith("warmed 30 files (79 MiB) in 2.0 s (39.5 MiB/s); 60 MiB from")
    assert "about 19 MiB of it was already cached" in lines[0]
    assert lines[1].startswith("the cache is full: stopped before train/31.bin")
    assert "89 MiB of 100 MiB, pruning starts at 90 MiB" in lines[1]
    assert "1 files left out, each too large" in lines[2]
    doc = summary_json(r, mountpoint="/mnt/data", source="az://c")
    assert doc["ok"] is True
    assert doc["cache_full"] is True
    assert doc["stopped_before"] == "train/31.bin"
    assert doc["bytes_from_storage"] == 60 * MiB
    assert doc["cache"] == {
        "used_bytes": 89 * MiB,
        "capacity_bytes": 100 * MiB,
        "prune_start_bytes": 90 * MiB,
    }


def test_failures_and_interruptions_are_not_ok():
    r = result(failures=[Failure("a.bin", "Input/output error")], interrupted="SIGINT")
    lines = summary_lines(r)
    assert any(line.startswith("interrupted by SIGINT") for line in lines)
    assert "  a.bin: Input/output error" in lines
    doc = summary_json(r, mountpoint="/mnt/data", source="az://c")
    assert doc["ok"] is False
    assert doc["failures"] == [{"path": "a.bin", "reason": "Input/output error"}]


def test_progress_is_a_bar_on_a_terminal_and_log_lines_otherwise(caplog):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert make_reporter(enabled=False) is None
    out = Tty()
    bar = make_reporter(True, out)
    assert isinstance(bar, BarReporter)
    bar.update(Progress(3, 30 * MiB, False, 1, 10 * MiB, 1.0, throttled=True))
    bar.close()
    assert "warm" in out.getvalue()
    assert "1/3+ files, waiting for disk writes" in out.getvalue()

    assert isinstance(make_reporter(True, io.StringIO()), ProgressLog)
    now = [0.0]
    lines = log_reporter(clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="blobmount.warm.report"):
        lines.update(Progress(3, 30 * MiB, True, 0, 0, 0.0, False))
        now[0] = 10
        lines.update(Progress(3, 30 * MiB, True, 2, 20 * MiB, 10.0, False))
    (record,) = caplog.records
    assert record.getMessage() == "progress: 2/3 files, 20 MiB of 30 MiB, 2 MiB/s"
