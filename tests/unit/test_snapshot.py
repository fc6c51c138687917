"""The typed stats snapshot: its JSON is exactly the dict the daemon used to build, it reads back
equal, and a reader is told which figure is missing or malformed instead of seeing a zero."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from blobmount.namespace.inodes import ROOT_INODE
from blobmount.settings import load_settings
from blobmount.snapshot import LiveMount, MountSnapshot, SnapshotFormatError
from blobmount.source import SourceSpec
from blobmount.stats import fetch_snapshot, fetch_stats, format_stats, serve_stats
from blobmount.storage.memory import InMemoryStorageClient
from blobmount.testing.pattern import pattern_bytes
from blobmount.units import format_size
from tests.helpers.composed_mount import PROCESS, composed_mount, live_mount

KiB = 1024


def distinct_snapshot(*, disk: bool = True, whole_file: bool = True) -> MountSnapshot:
    """A snapshot in which no two figures are equal: ints count up from 3, floats are the next
    count plus a half, so a figure read from the wrong field cannot pass for the right one."""
    counter = itertools.count(3)

    def make(hint: Any) -> Any:
        if typing.get_origin(hint) in (types.UnionType, typing.Union):
            (hint,) = (arg for arg in typing.get_args(hint) if arg is not type(None))
        if dataclasses.is_dataclass(hint):
            return build(hint)
        if typing.get_origin(hint) is tuple:  # a list of sections: two of them
            (item, _) = typing.get_args(hint)
            return (make(item), make(item))
        if typing.get_origin(hint) is dict:
            return {"StorageUnavailable": next(counter), "BlobChanged": next(counter)}
        if hint is bool:
            return True
        if hint is int:
            return next(counter)
        if hint is float:
            return next(counter) + 0.5
        assert hint is str, hint
        return f"text-{next(counter)}"

    def build(cls: Any) -> Any:
        hints = typing.get_type_hints(cls)
        return cls(**{f.name: make(hints[f.name]) for f in dataclasses.fields(cls)})

    snapshot = build(MountSnapshot)
    return dataclasses.replace(
        snapshot,
        disk=snapshot.disk if disk else None,
        whole_file=snapshot.whole_file if whole_file else None,
    )


def leaves(data: object, path: str = "") -> Iterator[tuple[str, object]]:
    """(dotted key, value) of every figure in a JSON snapshot."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from leaves(value, f"{path}.{key}" if path else key)
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from leaves(value, f"{path}[{index}]")
    else:
        yield path, data


def test_every_figure_of_the_test_snapshot_differs():
    values = [v for _, v in leaves(distinct_snapshot().to_json()) if not isinstance(v, bool)]
    assert len(values) > 100
    assert len(set(values)) == len(values)


@pytest.mark.parametrize(("disk", "whole_file"), [(True, True), (True, False), (False, False)])
def test_json_text_reads_back_equal(disk, whole_file):
    snapshot = distinct_snapshot(disk=disk, whole_file=whole_file)
    data = json.loads(json.dumps(snapshot.to_json()))
    assert MountSnapshot.from_json(data) == snapshot
    assert (data["disk"] is None, data["whole_file"] is None) == (not disk, not whole_file)


def test_to_json_keeps_the_wire_keys_in_order():
    data = distinct_snapshot().to_json()
    assert list(data) == [
        *("source", "mountpoint", "pid", "uptime_s", "throughput_bytes_per_s", "open_files"),
        *("inodes", "namespace", "storage", "retry", "blocks", "disk", "hints", "whole_file"),
        "flow",
        "processes",
    ]
    assert data["blocks"]["ram"]["hits"] == distinct_snapshot().blocks.ram.hits


@pytest.mark.parametrize(
    "path", ["pid", "blocks", "blocks.ram.hits", "disk.writer.queued_bytes", "storage.errors"]
)
def test_a_missing_figure_is_an_error_naming_it(path):
    data = distinct_snapshot().to_json()
    *parents, leaf = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    del node[leaf]
    with pytest.raises(SnapshotFormatError, match=rf"lack '{path}' \(is the daemon a different"):
        MountSnapshot.from_json(data)


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("storage.range_bytes", "12", "int"),
        ("storage.range_bytes", 1.5, "int"),
        ("blocks.reads", True, "int"),  # JSON true is not a count
        ("uptime_s", None, "float"),
        ("source", 7, "str"),
        ("disk.space.disk_full", 0, "bool"),
        ("blocks", [], "an object"),
        ("storage.errors", {"X": "1"}, "an object of counts"),
    ],
)
def test_a_figure_of_the_wrong_type_is_an_error_naming_it(path, value, expected):
    data = distinct_snapshot().to_json()
    *parents, leaf = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    node[leaf] = value
    with pytest.raises(SnapshotFormatError) as info:
        MountSnapshot.from_json(data)
    assert str(info.value) == f"the mount's stats have {path!r} = {value!r}, expected {expected}"


def test_a_whole_number_in_a_float_field_reads_as_a_float():
    data = distinct_snapshot().to_json()
    data["uptime_s"] = 12
    assert MountSnapshot.from_json(data).uptime_s == 12.0
    assert isinstance(MountSnapshot.from_json(data).uptime_s, float)


def test_unknown_figures_are_ignored_and_missing_optional_sections_are_off():
    snapshot = distinct_snapshot()
    newer = snapshot.to_json()
    newer["version"] = 2
    newer["blocks"]["ram"]["compressed_bytes"] = 1
    assert MountSnapshot.from_json(newer) == snapshot  # a newer daemon's extra figures
    older = snapshot.to_json()
    del older["disk"], older["whole_file"]  # a daemon from before these tiers
    del older["processes"]  # and before the figures of each process
    assert MountSnapshot.from_json(older) == dataclasses.replace(
        snapshot, disk=None, whole_file=None, processes=()
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"pid": 1}, "lacks"),
        ([{"pid": 1}], "lack 'processes[0].main'"),
        (
            [
                {
                    **{"pid": 1, "main": True, "requests": "3", "passed_on": 0},
                    **{"answered_for_others": 0, "bytes_served": 0, "cpu_s": 1.0},
                    "shared_lock_s": 0,
                }
            ],
            "'3'",
        ),
    ],
)
def test_a_bad_process_list_is_an_error_naming_where(value, message):
    data = distinct_snapshot().to_json()
    data["processes"] = value
    with pytest.raises(SnapshotFormatError, match="processes"):
        MountSnapshot.from_json(data)
    if message != "lacks":
        with pytest.raises(SnapshotFormatError, match=re.escape(message)):
            MountSnapshot.from_json(data)


# -- the snapshot of a live mount -----------------------------------------------------------------


def old_daemon_dict(parts: Any, stack: Any, live: LiveMount, uptime_s: float) -> dict[str, Any]:
    """The daemon's stats dict as built before MountSnapshot existed (its `snapshot()` closure),
    kept here as the reference the JSON must still match."""
    asdict = dataclasses.asdict
    fs, whole_files = parts.fs, parts.whole_files
    return {
        "source": live.source,
        "mountpoint": live.mountpoint,
        "pid": os.getpid(),
        "uptime_s": uptime_s,
        "throughput_bytes_per_s": live.throughput(),
        "open_files": fs.open_files,
        "inodes": len(fs.inodes),
        "namespace": asdict(fs.statistics()),
        "storage": asdict(stack.counting.statistics()),
        "retry": asdict(stack.retrying.statistics()),
        "blocks": asdict(parts.blocks.statistics()),
        "disk": None if parts.disk is None else asdict(parts.disk.statistics()),
        "hints": asdict(parts.hints.statistics()),
        "whole_file": None if whole_files is None else asdict(whole_files.statistics()),
        "flow": asdict(stack.flow.statistics()),  # added with the flow controller (#27)
        "processes": [asdict(PROCESS)],  # added with the per-process figures (#25)
    }


@pytest.mark.parametrize("block_mode", [True, False], ids=["blocks+disk", "whole-file"])
async def test_a_live_mounts_json_is_the_old_dict(tmp_path: Path, block_mode: bool) -> None:
    mem = InMemoryStorageClient()
    for i in range(3):
        mem.put(f"d/f{i}.bin", pattern_bytes(f"f{i}", 0, 300 * KiB + i))
    settings = load_settings(
        {},
        cache_dir=tmp_path / "cache",
        block_based_cache_enabled=block_mode,
        read_block_size=64 * KiB,
    )
    spec = SourceSpec(scheme="az", container="data")

    async with composed_mount(settings, spec, mem) as (stack, parts):
        fs = parts.fs
        folder = await fs.lookup(ROOT_INODE, "d")
        assert folder is not None
        for i in range(2):  # one file left closed, one open, so the gauges are not all zero
            node = await fs.lookup(folder.inode, f"f{i}.bin")
            assert node is not None
            opened = await fs.open(node.inode, os.O_RDONLY)
            assert await fs.read(opened.fh, 0, 100 * KiB) == pattern_bytes(f"f{i}", 0, 100 * KiB)
            if i == 0:
                fs.release(opened.fh)
        await trio.testing.wait_all_tasks_blocked()
        live = live_mount(spec, stack, parts, throughput=1234.5)
        snapshot = live.snapshot()
        old = old_daemon_dict(parts, stack, live, snapshot.uptime_s)

    assert json.dumps(snapshot.to_json()) == json.dumps(old)  # same keys, order and values
    assert MountSnapshot.from_json(json.loads(json.dumps(old))) == snapshot
    assert (snapshot.disk is None, snapshot.whole_file is None) == (not block_mode, block_mode)
    assert snapshot.storage.range_requests > 0
    assert snapshot.open_files == 1


async def test_the_socket_serves_the_json_and_reads_back_the_snapshot(tmp_path: Path) -> None:
    snapshot = distinct_snapshot(whole_file=False)
    path = tmp_path / "stats.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_stats, path, lambda: snapshot)
        raw = await trio.to_thread.run_sync(fetch_stats, path)
        typed = await trio.to_thread.run_sync(fetch_snapshot, path)
        nursery.cancel_scope.cancel()
    assert raw == snapshot.to_json()
    assert typed == snapshot


def test_format_stats_reads_each_line_from_its_figures():
    s = distinct_snapshot(whole_file=False)
    text = format_stats(s)
    st, blocks, disk, hints = s.storage, s.blocks, s.disk, s.hints
    assert disk is not None
    for line in (
        f"source            {s.source}",
        f"mount point       {s.mountpoint} (pid {s.pid}, up {s.uptime_s:.0f}s)",
        f"{st.range_requests} range ({format_size(st.range_bytes)}), {st.list_requests} list, "
        f"{st.properties_requests} properties",
        f"{s.retry.retries} retries, {s.retry.gave_up} gave up; errors: BlobChanged "
        f"{st.errors['BlobChanged']}, StorageUnavailable {st.errors['StorageUnavailable']}",
        f"(buffer {blocks.buffer_hits}, RAM tier {blocks.ram_hits})",
        f"{blocks.prefetch_started} fetched, {blocks.prefetch_used} used, "
        f"{blocks.prefetch_wasted} wasted",
        f"({blocks.ram.entries} blocks)",
        f"({disk.space.entries} blocks), {disk.hits} hits, {disk.corrupt} corrupt",
        f"{disk.writer.written} written, "
        f"{disk.writer.dropped_queue_full + disk.writer.dropped_no_space + disk.writer.failed}"
        " not written",
        f"hints             {hints.received} received, {hints.used} used, {hints.late} late, "
        f"{hints.wasted} wasted, {hints.invalid} invalid; {hints.ahead} files ahead, "
        f"{hints.queued} queued, {hints.streams} streams",
        f"waiting on storage {blocks.storage_waits} reads, {blocks.storage_wait_s:.2f}s total; "
        f"{blocks.fetcher.in_flight} fetches in flight",
        f"open files        {s.open_files}, inodes {s.inodes}",
    ):
        assert line in text, line
    assert "whole-file cache" not in text
    main, worker = s.processes
    total = main.requests + worker.requests
    assert (
        f"processes         2, {total} requests: pid {main.pid} (main) "
        f"{main.requests / total:.1%}, {main.cpu_s:.1f}s CPU; pid {worker.pid} (main) " in text
    )
    assert f"shared locks held {main.shared_lock_s + worker.shared_lock_s:.3f}s" in text
    one = format_stats(dataclasses.replace(s, processes=(dataclasses.replace(main, main=True),)))
    assert f"processes         1, {main.requests} requests: pid {main.pid} (main) 100.0%" in one
    assert "processes " not in format_stats(dataclasses.replace(s, processes=()))
    off = format_stats(dataclasses.replace(s, disk=None))
    assert "disk tier         off" in off
    assert "; disk off" in off
