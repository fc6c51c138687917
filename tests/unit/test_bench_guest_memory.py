"""The benchmark harness's prefault (benchmarks/scenarios/guest_memory.py): how much it takes,
and that it leaves the memory it wrote free again."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
from scenarios import guest_memory
from scenarios.guest_memory import (
    PREFAULT_HEADROOM_BYTES,
    available_memory_bytes,
    prefault_free_memory,
    prefault_size,
)

GiB = 1 << 30


def test_prefault_size_keeps_headroom_free():
    assert prefault_size(3 * GiB, 20 * GiB) == 3 * GiB
    assert prefault_size(3 * GiB, PREFAULT_HEADROOM_BYTES + GiB) == GiB
    assert prefault_size(3 * GiB, PREFAULT_HEADROOM_BYTES - 1) == 0
    assert prefault_size(3 * GiB, None) == 0
    assert prefault_size(GiB + 5, 20 * GiB) % 4096 == 0


def test_available_memory_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   1000 kB\n")
    assert available_memory_bytes(meminfo) == 1000 * 1024
    meminfo.write_text("MemTotal:       24000000 kB\n")
    assert available_memory_bytes(meminfo) is None
    assert available_memory_bytes(tmp_path / "missing") is None


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_prefault_writes_the_memory_and_frees_it():
    if available_memory_bytes() is None or available_memory_bytes() < PREFAULT_HEADROOM_BYTES + GiB:
        pytest.skip("not enough free memory here")
    before = _rss_kib()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    done = prefault_free_memory(256 << 20)
    assert done.bytes == 256 << 20
    assert done.seconds > 0
    # every page was faulted in (written), not just mapped
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults >= (256 << 20) // 4096
    assert _rss_kib() - before < 64 << 10  # unmapped again, not held


def test_prefault_does_nothing_without_memory_to_spare(monkeypatch):
    monkeypatch.setattr(guest_memory, "available_memory_bytes", lambda: PREFAULT_HEADROOM_BYTES)
    assert prefault_free_memory(GiB) == guest_memory.Prefault(0, 0.0)


def test_a_run_prefaults_once_and_only_when_asked(monkeypatch, tmp_path):
    from scenarios import base, measure

    calls = []
    monkeypatch.setattr(
        base, "prefault_free_memory", lambda n: calls.append(n) or guest_memory.Prefault(n, 0.1)
    )
    bench = base.Bench(datasets=None, profile=None, out_dir=tmp_path)  # type: ignore[arg-type]
    bench.arm_prefault(GiB)
    meter = measure.ResourceMeter({}, bench.prepare_memory)
    for _ in range(3):  # a run with phases starts its meter once per phase
        meter.start()
        meter.stop()
    assert calls == [GiB]
    assert bench.last_prefault == guest_memory.Prefault(GiB, 0.1)
    bench.arm_prefault(GiB)  # the next run writes again
    meter.start()
    assert calls == [GiB, GiB]

    bench = base.Bench(datasets=None, profile=None, out_dir=tmp_path, prefault=False)  # type: ignore[arg-type]
    bench.arm_prefault(GiB)
    measure.ResourceMeter({}, bench.prepare_memory).start()
    assert calls == [GiB, GiB]
    assert bench.last_prefault is None
