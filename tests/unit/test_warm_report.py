"""`blobmount warm`'s summary: what it says when the cache filled up, and its JSON."""

from __future__ import annotations

import dataclasses

from blobmount.warm.budget import CacheView
from blobmount.warm.report import summary_json, summary_lines
from blobmount.warm.warmer import Failure, WarmResult
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
