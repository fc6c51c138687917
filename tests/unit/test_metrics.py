"""Prometheus metrics: built from the stats snapshot (no second set of counters), served over
HTTP on 127.0.0.1, with the snapshot taken on the trio thread."""

from __future__ import annotations

import re
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from blobmount.blocks.keys import BlobVersion
from blobmount.blocks.manager import BlockManager, BlockManagerConfig
from blobmount.errors import ConfigError
from blobmount.metrics import metric_families, metric_names, open_metrics, start_metrics_server
from blobmount.stats import as_dict
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.memory import InMemoryStorageClient
from blobmount.storage.retry import RetryingStorageClient
from blobmount.testing.pattern import pattern_bytes

B = 64 * 1024
DOCS = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"


async def live_snapshot(nursery: trio.Nursery) -> dict[str, Any]:
    """A snapshot shaped like the daemon's, from real components after a real read."""
    mem = InMemoryStorageClient()
    props = mem.put("data/x.bin", pattern_bytes("x", 0, 5 * B))
    retrying = RetryingStorageClient(mem)
    storage = CountingStorageClient(retrying)
    config = BlockManagerConfig(
        block_size=B,
        read_ahead_blocks=4,
        prefetch_slots=4,
        ram_bytes=16 * B,
        read_ahead_budget_bytes=8 * B,
    )
    blocks = BlockManager(storage, config, nursery)
    for _ in range(2):  # the second pass is served by the RAM tier
        handle = blocks.open(BlobVersion(props.name, props.etag, props.size))
        offset = 0
        while chunk := await blocks.read(handle, offset, 32 * 1024):
            offset += len(chunk)
        await trio.testing.wait_all_tasks_blocked()
        blocks.close(handle)
    return {
        "source": "http://127.0.0.1:10000/devstoreaccount1/c",
        "mountpoint": "/mnt/data",
        "pid": 1,
        "uptime_s": 12.5,
        "throughput_bytes_per_s": 1000.0,
        "open_files": 0,
        "inodes": 3,
        "storage": as_dict(storage.statistics()),
        "retry": as_dict(retrying.statistics()),
        "blocks": as_dict(blocks.statistics()),
        "disk": None,
    }


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def exposition(snapshot: dict[str, Any]) -> str:
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from blobmount.metrics import SnapshotCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snapshot))
    return generate_latest(registry).decode()


async def test_metrics_are_the_snapshot_figures(nursery: trio.Nursery) -> None:
    s = await live_snapshot(nursery)
    got = samples(exposition(s))
    blocks, storage = s["blocks"], s["storage"]
    # 5 blocks fetched once (adjacent read-ahead blocks share a request)...
    assert storage["range_bytes"] == 5 * B
    assert 1 <= storage["range_requests"] <= 5
    assert blocks["ram_hits"] >= 5  # ...and read again from RAM
    expected = {
        ("blobmount_storage_requests_total", (("operation", "range"),)): storage["range_requests"],
        ("blobmount_storage_read_bytes_total", ()): storage["range_bytes"],
        ("blobmount_read_bytes_total", ()): blocks["bytes_served"],
        ("blobmount_reads_total", ()): blocks["reads"],
        ("blobmount_block_lookups_total", (("source", "ram"),)): blocks["ram_hits"],
        ("blobmount_block_lookups_total", (("source", "buffer"),)): blocks["buffer_hits"],
        ("blobmount_block_lookups_total", (("source", "fetch"),)): blocks["storage_waits"],
        ("blobmount_readahead_blocks_fetched_total", ()): blocks["prefetch_started"],
        ("blobmount_readahead_blocks_used_total", ()): blocks["prefetch_used"],
        ("blobmount_ram_cache_bytes", ()): blocks["ram"]["used_bytes"],
        ("blobmount_ram_cache_limit_bytes", ()): 16 * B,
        ("blobmount_readahead_limit_bytes", ()): 8 * B,
        ("blobmount_storage_wait_seconds_total", ()): blocks["storage_wait_s"],
        ("blobmount_read_throughput_bytes_per_second", ()): 1000.0,
        ("blobmount_storage_retries_total", ()): 0,
        (
            "blobmount_mount_info",
            (("mountpoint", "/mnt/data"), ("source", "http://127.0.0.1:10000/devstoreaccount1/c")),
        ): 1,
    }
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key


async def test_without_disk_tier_no_disk_metric_is_exported(nursery: trio.Nursery) -> None:
    s = await live_snapshot(nursery)
    names = {name for name, _ in samples(exposition(s))}
    assert not any(name.startswith("blobmount_disk_") for name in names)
    s.pop("disk")  # an older daemon without the key at all
    assert samples(exposition(s))


def test_disk_tier_and_errors_by_kind_are_exported() -> None:
    s = {
        "source": "az://c",
        "mountpoint": "/m",
        "storage": {"range_requests": 3, "errors": {"StorageUnavailable": 2, "BlobChanged": 1}},
        "disk": {
            "hits": 7,
            "misses": 3,
            "corrupt": 1,
            "space": {"used_bytes": 100, "capacity_bytes": 1000, "entries": 2},
            "writer": {
                "queued_bytes": 0,
                "max_queue_bytes": 512,
                "written": 4,
                "dropped_queue_full": 1,
                "dropped_no_space": 0,
                "failed": 0,
            },
        },
    }
    got = samples(exposition(s))
    assert got[("blobmount_storage_errors_total", (("kind", "StorageUnavailable"),))] == 2
    assert got[("blobmount_storage_errors_total", (("kind", "BlobChanged"),))] == 1
    assert got[("blobmount_disk_cache_hits_total", ())] == 7
    assert got[("blobmount_disk_cache_misses_total", ())] == 3
    assert got[("blobmount_disk_cache_limit_bytes", ())] == 1000
    assert got[("blobmount_disk_blocks_not_written_total", (("reason", "queue_full"),))] == 1
    # figures missing from the snapshot are left out, not reported as 0
    assert ("blobmount_reads_total", ()) not in got


def test_every_metric_name_is_documented() -> None:
    text = DOCS.read_text()
    missing = [name for name in metric_names() if f"`{name}`" not in text]
    assert not missing, f"not in docs/OPERATIONS.md: {missing}"
    documented = set(re.findall(r"`(blobmount_[a-z_]+)`", text))
    assert documented <= set(metric_names()), documented - set(metric_names())


def test_every_family_is_in_metric_names() -> None:
    full = {
        "source": "s",
        "mountpoint": "m",
        "storage": {"errors": {"X": 1}},
        "disk": {"space": {}, "writer": {}},
    }
    # walk every path in the tables so each family is produced once
    from blobmount.metrics import LABELLED, SIMPLE

    def put(path: str) -> None:
        node = full
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = 1

    for *_, path in SIMPLE:
        put(path)
    for *_, paths in LABELLED:
        for path in paths.values():
            put(path)
    names = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in metric_families(full)
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

    def snapshot() -> dict[str, Any]:
        calls.append(threading.current_thread())
        return {"source": "s", "mountpoint": "m", "uptime_s": 1.5}

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
    server.publish(dict, None)
    assert "blobmount_mount_info" in scrape(server.url)
    server.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    start_metrics_server("127.0.0.1", port).close()  # bindable again


async def test_open_metrics_binds_on_entry_and_closes_on_exit() -> None:
    port = free_port()
    async with open_metrics(f"127.0.0.1:{port}") as metrics:
        assert metrics.server is not None
        metrics.publish(lambda: {"source": "s", "mountpoint": "m", "inodes": 7})
        text = await trio.to_thread.run_sync(scrape, f"http://127.0.0.1:{port}/metrics")
        assert samples(text)[("blobmount_inodes", ())] == 7
    with pytest.raises(OSError):
        await trio.to_thread.run_sync(scrape, f"http://127.0.0.1:{port}/metrics")
    async with open_metrics(None) as off:
        assert off.server is None
        off.publish(dict)  # a no-op


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
