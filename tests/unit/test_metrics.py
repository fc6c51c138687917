"""Prometheus metrics: built from the stats snapshot (no second set of counters), served over
HTTP on 127.0.0.1, with the snapshot taken on the trio thread."""

from __future__ import annotations

import dataclasses
import operator
import os
import re
import socket
import urllib.request
from pathlib import Path

import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from blobmount.errors import ConfigError
from blobmount.metrics import metric_families, metric_names, open_metrics, start_metrics_server
from blobmount.namespace.inodes import ROOT_INODE
from blobmount.settings import load_settings
from blobmount.snapshot import MountSnapshot
from blobmount.source import SourceSpec
from blobmount.storage.memory import InMemoryStorageClient
from blobmount.testing.pattern import pattern_bytes
from tests.helpers.composed_mount import composed_mount, live_mount
from tests.unit.test_snapshot import distinct_snapshot

B = 64 * 1024
DOCS = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"

Sample = tuple[str, tuple[tuple[str, str], ...]]

#: every sample the endpoint exports for a mount, and the snapshot figure it must equal: written
#: out here, apart from metrics.py's tables, so that a metric wired to the wrong figure fails
#: `test_each_metric_is_the_figure_it_names` (every figure of its snapshot differs)
FIGURE_OF: dict[Sample, str] = {
    ("blobmount_uptime_seconds", ()): "uptime_s",
    ("blobmount_open_files", ()): "open_files",
    ("blobmount_inodes", ()): "inodes",
    ("blobmount_reads_total", ()): "blocks.reads",
    ("blobmount_read_bytes_total", ()): "blocks.bytes_served",
    ("blobmount_read_throughput_bytes_per_second", ()): "throughput_bytes_per_s",
    ("blobmount_block_lookups_total", (("source", "buffer"),)): "blocks.buffer_hits",
    ("blobmount_block_lookups_total", (("source", "ram"),)): "blocks.ram_hits",
    ("blobmount_block_lookups_total", (("source", "fetch"),)): "blocks.storage_waits",
    ("blobmount_storage_wait_seconds_total", ()): "blocks.storage_wait_s",
    ("blobmount_storage_requests_total", (("operation", "range"),)): "storage.range_requests",
    ("blobmount_storage_requests_total", (("operation", "list"),)): "storage.list_requests",
    ("blobmount_storage_requests_total", (("operation", "properties"),)): (
        "storage.properties_requests"
    ),
    ("blobmount_storage_read_bytes_total", ()): "storage.range_bytes",
    ("blobmount_storage_errors_total", (("kind", "BlobChanged"),)): "storage.errors.BlobChanged",
    ("blobmount_storage_errors_total", (("kind", "StorageUnavailable"),)): (
        "storage.errors.StorageUnavailable"
    ),
    ("blobmount_storage_retries_total", ()): "retry.retries",
    ("blobmount_storage_gave_up_total", ()): "retry.gave_up",
    ("blobmount_storage_requests_sent_total", ()): "flow.sent",
    ("blobmount_storage_throttled_total", ()): "flow.throttled",
    ("blobmount_storage_timeouts_total", ()): "flow.timeouts",
    ("blobmount_storage_in_flight", ()): "flow.in_flight",
    ("blobmount_storage_in_flight_limit", ()): "flow.in_flight_limit",
    ("blobmount_storage_in_flight_limit_max", ()): "flow.in_flight_limit_max",
    ("blobmount_storage_limit_cuts_total", ()): "flow.limit_cuts",
    ("blobmount_storage_send_rate", ()): "flow.send_rate",
    ("blobmount_storage_rate_cuts_total", ()): "flow.rate_cuts",
    ("blobmount_storage_queued_seconds_total", ()): "flow.queued_s",
    ("blobmount_storage_breaker_open_seconds", ()): "flow.breaker_open_s",
    ("blobmount_storage_breaker_opened_total", ()): "flow.breaker_opened",
    ("blobmount_storage_fast_failures_total", ()): "flow.fast_failures",
    ("blobmount_storage_breaker_state", (("state", "closed"),)): "flow.breaker==closed",
    ("blobmount_storage_breaker_state", (("state", "open"),)): "flow.breaker==open",
    ("blobmount_storage_breaker_state", (("state", "half-open"),)): "flow.breaker==half-open",
    ("blobmount_fetches_in_flight", ()): "blocks.fetcher.in_flight",
    ("blobmount_fetch_failures_total", ()): "blocks.fetcher.failed",
    ("blobmount_readahead_blocks_fetched_total", ()): "blocks.prefetch_started",
    ("blobmount_readahead_blocks_used_total", ()): "blocks.prefetch_used",
    ("blobmount_readahead_blocks_wasted_total", ()): "blocks.prefetch_wasted",
    ("blobmount_readahead_skipped_total", ()): "blocks.prefetch_skipped_budget",
    ("blobmount_readahead_bytes", ()): "blocks.read_ahead_bytes",
    ("blobmount_readahead_limit_bytes", ()): "blocks.read_ahead_budget_bytes",
    ("blobmount_ram_cache_bytes", ()): "blocks.ram.used_bytes",
    ("blobmount_ram_cache_limit_bytes", ()): "blocks.ram.capacity_bytes",
    ("blobmount_ram_cache_blocks", ()): "blocks.ram.entries",
    ("blobmount_ram_cache_evictions_total", ()): "blocks.ram.evictions",
    ("blobmount_disk_cache_hits_total", ()): "disk.hits",
    ("blobmount_disk_cache_misses_total", ()): "disk.misses",
    ("blobmount_disk_cache_corrupt_total", ()): "disk.corrupt",
    ("blobmount_disk_cache_slow_inline_reads_total", ()): "disk.inline.slow_reads",
    ("blobmount_disk_cache_bytes", ()): "disk.space.used_bytes",
    ("blobmount_disk_cache_limit_bytes", ()): "disk.space.capacity_bytes",
    ("blobmount_disk_cache_blocks", ()): "disk.space.entries",
    ("blobmount_disk_write_queue_bytes", ()): "disk.writer.queued_bytes",
    ("blobmount_disk_write_queue_limit_bytes", ()): "disk.writer.max_queue_bytes",
    ("blobmount_disk_blocks_written_total", ()): "disk.writer.written",
    ("blobmount_disk_blocks_not_written_total", (("reason", "queue_full"),)): (
        "disk.writer.dropped_queue_full"
    ),
    ("blobmount_disk_blocks_not_written_total", (("reason", "no_space"),)): (
        "disk.writer.dropped_no_space"
    ),
    ("blobmount_disk_blocks_not_written_total", (("reason", "failed"),)): "disk.writer.failed",
    ("blobmount_hints_received_total", ()): "hints.received",
    ("blobmount_hints_used_total", ()): "hints.used",
    ("blobmount_hints_late_total", ()): "hints.late",
    ("blobmount_hints_wasted_total", ()): "hints.wasted",
    ("blobmount_hints_ahead_files", ()): "hints.ahead",
    ("blobmount_hinted_bytes", ()): "blocks.hinted.held_bytes",
    ("blobmount_hinted_dropped_bytes_total", ()): "blocks.hinted.dropped_bytes",
    ("blobmount_whole_file_read_bytes_total", ()): "whole_file.served_bytes",
    ("blobmount_whole_file_downloads_total", ()): "whole_file.downloads",
    ("blobmount_whole_file_downloaded_bytes_total", ()): "whole_file.downloaded_bytes",
    ("blobmount_whole_file_cached_opens_total", ()): "whole_file.cached_opens",
    ("blobmount_whole_file_fallbacks_total", ()): "whole_file.fallbacks",
    ("blobmount_whole_file_failed_downloads_total", ()): "whole_file.failed_downloads",
    ("blobmount_whole_file_cache_bytes", ()): "whole_file.space.used_bytes",
    ("blobmount_whole_file_cache_limit_bytes", ()): "whole_file.space.capacity_bytes",
    ("blobmount_processes", ()): "len processes",
}


def figure(snapshot: MountSnapshot, path: str) -> float:
    """The figure at dotted `path` (attributes, then a key of storage.errors), or 1/0 for
    `path==value` (a state exported as one gauge per value)."""
    if "==" in path:
        path, value = path.split("==")
        return float(operator.attrgetter(path)(snapshot) == value)
    if path.startswith("len "):  # how many items a list has
        return float(len(operator.attrgetter(path.removeprefix("len "))(snapshot)))
    if path.startswith("storage.errors."):
        return float(snapshot.storage.errors[path.removeprefix("storage.errors.")])
    return float(operator.attrgetter(path)(snapshot))


def samples(text: str) -> dict[Sample, float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def exposition(snapshot: MountSnapshot) -> str:
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from blobmount.metrics import SnapshotCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snapshot))
    return generate_latest(registry).decode()


def test_each_metric_is_the_figure_it_names() -> None:
    s = distinct_snapshot()
    got = samples(exposition(s))
    info = ("blobmount_mount_info", (("mountpoint", s.mountpoint), ("source", s.source)))
    assert got.pop(info) == 1
    assert set(got) == set(FIGURE_OF)  # nothing exported that is not checked here, and back
    wrong = {
        name: (value, FIGURE_OF[name], figure(s, FIGURE_OF[name]))
        for name, value in got.items()
        if value != figure(s, FIGURE_OF[name])
    }
    assert not wrong, wrong


@pytest.mark.parametrize(("disk", "whole_file"), [(False, True), (True, False), (False, False)])
def test_a_tier_that_is_off_exports_nothing(disk: bool, whole_file: bool) -> None:
    s = distinct_snapshot(disk=disk, whole_file=whole_file)
    names = {name for name, _ in samples(exposition(s))}
    assert any(name.startswith("blobmount_disk_") for name in names) is disk
    assert any(name.startswith("blobmount_whole_file_") for name in names) is whole_file
    # the rest is as with every tier on
    expected = {
        name
        for name, _ in FIGURE_OF
        if not name.startswith(("blobmount_disk_", "blobmount_whole_file_"))
    }
    assert expected <= names


async def test_metrics_of_a_real_mount_count_what_was_read(tmp_path: Path) -> None:
    """Through real parts over the in-memory storage: 5 blocks read twice, with the figures the
    reads imply checked against the scrape."""
    mem = InMemoryStorageClient()
    mem.put("data/x.bin", pattern_bytes("x", 0, 5 * B))
    settings = load_settings(
        {},
        cache_dir=tmp_path / "cache",
        block_file_cache_enabled=False,
        read_block_size=B,
        memory_cache_size=16 * B,
        read_ahead_memory_limit=8 * B,
    )
    spec = SourceSpec(scheme="az", container="c")
    async with composed_mount(settings, spec, mem) as (stack, parts):
        fs = parts.fs
        folder = await fs.lookup(ROOT_INODE, "data")
        assert folder is not None
        node = await fs.lookup(folder.inode, "x.bin")
        assert node is not None
        for _ in range(2):  # the second pass is served by the RAM tier
            handle = await fs.open(node.inode, os.O_RDONLY)
            offset = 0
            while chunk := await fs.read(handle.fh, offset, 32 * 1024):
                offset += len(chunk)
            await trio.testing.wait_all_tasks_blocked()
            fs.release(handle.fh)
        s = live_mount(spec, stack, parts, throughput=1000.0).snapshot()
    got = samples(exposition(s))
    assert s.disk is None
    assert s.whole_file is None
    assert not any(name.startswith(("blobmount_disk_", "blobmount_whole_")) for name, _ in got)
    # every block came from storage once (adjacent read-ahead blocks share a request)...
    assert got[("blobmount_storage_read_bytes_total", ())] == 5 * B
    assert 1 <= got[("blobmount_storage_requests_total", (("operation", "range"),))] <= 5
    assert got[("blobmount_fetch_failures_total", ())] == 0
    # ...and was read again from RAM: 2 passes of 32 KiB reads (and one empty read at the end)
    assert got[("blobmount_read_bytes_total", ())] == 2 * 5 * B
    assert got[("blobmount_reads_total", ())] == 2 * (5 * B // (32 * 1024) + 1)
    assert got[("blobmount_block_lookups_total", (("source", "ram"),))] >= 5
    assert got[("blobmount_ram_cache_blocks", ())] == 5
    assert got[("blobmount_ram_cache_bytes", ())] == 5 * B
    assert got[("blobmount_ram_cache_limit_bytes", ())] == 16 * B
    assert got[("blobmount_readahead_limit_bytes", ())] == 8 * B
    assert got[("blobmount_open_files", ())] == 0
    assert got[("blobmount_read_throughput_bytes_per_second", ())] == 1000.0
    for name, path in FIGURE_OF.items():
        if name in got:
            assert got[name] == figure(s, path), name


def test_every_metric_name_is_documented() -> None:
    text = DOCS.read_text()
    missing = [name for name in metric_names() if f"`{name}`" not in text]
    assert not missing, f"not in docs/OPERATIONS.md: {missing}"
    documented = set(re.findall(r"`(blobmount_[a-z_]+)`", text))
    assert documented <= set(metric_names()), documented - set(metric_names())


def test_every_family_is_in_metric_names() -> None:
    names = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in metric_families(distinct_snapshot())
    }
    assert names == set(metric_names())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


async def test_server_takes_the_snapshot_on_the_trio_thread() -> None:
    import threading

    calls: list[threading.Thread] = []

    def snapshot() -> MountSnapshot:
        calls.append(threading.current_thread())
        return dataclasses.replace(distinct_snapshot(), uptime_s=1.5)

    server = start_metrics_server("127.0.0.1", 0)
    try:
        assert server.url.startswith("http://127.0.0.1:")
        # bound, but the mount is not there yet: only the process's own metrics
        early = await trio.to_thread.run_sync(scrape, server.url)
        assert "process_resident_memory_bytes" in early  # the daemon's RSS, for memory bounds
        assert "blobmount_" not in early
        server.publish(snapshot, trio.lowlevel.current_trio_token())
        text = await trio.to_thread.run_sync(scrape, server.url)
    finally:
        server.close()
    assert samples(text)[("blobmount_uptime_seconds", ())] == 1.5
    assert calls == [threading.main_thread()]  # trio runs on the test's main thread


def test_close_frees_the_port() -> None:
    port = free_port()
    server = start_metrics_server("127.0.0.1", port)
    server.publish(distinct_snapshot, None)
    assert "blobmount_mount_info" in scrape(server.url)
    server.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    start_metrics_server("127.0.0.1", port).close()  # bindable again


async def test_open_metrics_binds_on_entry_and_closes_on_exit() -> None:
    port = free_port()
    async with open_metrics(f"127.0.0.1:{port}") as metrics:
        assert metrics.server is not None
        metrics.publish(lambda: dataclasses.replace(distinct_snapshot(), inodes=7))
        text = await trio.to_thread.run_sync(scrape, f"http://127.0.0.1:{port}/metrics")
        assert samples(text)[("blobmount_inodes", ())] == 7
    with pytest.raises(OSError):
        await trio.to_thread.run_sync(scrape, f"http://127.0.0.1:{port}/metrics")
    async with open_metrics(None) as off:
        assert off.server is None
        off.publish(distinct_snapshot)  # a no-op


async def test_a_busy_port_is_refused_naming_the_variable() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        with pytest.raises(ConfigError) as info:
            async with open_metrics(address):
                pass
    message = str(info.value)
    assert message.startswith(f"DATASET_MOUNT_METRICS_ADDR='{address}': cannot serve metrics")
    assert "in use" in message
