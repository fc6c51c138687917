"""The stats of a mount served by several processes: each process publishes its snapshot to the
shared folder, and the main process reports its own plus the others', each figure added up as
`stats_share.FIELDS` says (counters over every process, dead ones too; gauges over the live
ones; settings and limits from the main process), with a file that is corrupt, or its own,
ignored."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import threading
import traceback
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from blobmount.process_stats import FIELDS, Kind, StatsShare, publish_every
from blobmount.snapshot import MountSnapshot
from tests.unit.test_snapshot import distinct_snapshot

SUMMED = (Kind.COUNTER, Kind.GAUGE, Kind.SHARE, Kind.PEAK)


# -- the table names every figure --------------------------------------------------------------


def _unwrap(hint: Any) -> Any:
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        (hint,) = (arg for arg in typing.get_args(hint) if arg is not type(None))
    return hint


def stats_classes(root: type) -> dict[type, dict[str, Any]]:
    """Every dataclass reachable from `root`, with the type of each of its fields."""
    found: dict[type, dict[str, Any]] = {}

    def visit(cls: type) -> None:
        if cls in found:
            return
        hints = typing.get_type_hints(cls)
        found[cls] = {f.name: _unwrap(hints[f.name]) for f in dataclasses.fields(cls)}
        for hint in found[cls].values():
            if dataclasses.is_dataclass(hint):
                visit(hint)

    visit(root)
    return found


def unclassified(root: type, table: typing.Mapping[type, typing.Mapping[str, Kind]]) -> list[str]:
    """What is wrong with `table` for the dataclasses under `root` (empty: nothing)."""
    problems = []
    classes = stats_classes(root)
    for cls, fields in classes.items():
        leaves = {name: hint for name, hint in fields.items() if not dataclasses.is_dataclass(hint)}
        named = table.get(cls, {})
        problems.extend(
            f"{cls.__name__}.{name} is not classified in FIELDS"
            for name in sorted(leaves.keys() - named.keys())
        )
        problems.extend(
            f"{cls.__name__}.{name} is classified but is no field"
            for name in sorted(named.keys() - leaves.keys())
        )
        for name, kind in named.items():
            hint = leaves.get(name)
            numeric = hint in (int, float) or typing.get_origin(hint) is dict
            if kind in SUMMED and not numeric:
                problems.append(f"{cls.__name__}.{name} ({hint}) cannot be {kind.name}")
    problems.extend(f"{cls.__name__} is no part of a snapshot" for cls in table.keys() - classes)
    return problems


def test_every_figure_of_every_stats_dataclass_is_classified():
    """A new field must be put in FIELDS by hand: a limit summed like a counter would say N
    times the configured value."""
    assert len(stats_classes(MountSnapshot)) >= 16
    assert unclassified(MountSnapshot, FIELDS) == []


@dataclasses.dataclass(frozen=True)
class _Section:
    hits: int
    new_limit: int


@dataclasses.dataclass(frozen=True)
class _Root:
    name: str
    section: _Section | None


def test_the_check_finds_a_new_field_nobody_classified():
    table = {_Root: {"name": Kind.COUNTER}, _Section: {"hits": Kind.COUNTER}, int: {}}
    assert unclassified(_Root, table) == [
        "_Root.name (<class 'str'>) cannot be COUNTER",
        "_Section.new_limit is not classified in FIELDS",
        "int is no part of a snapshot",
    ]


# -- snapshots of three processes ---------------------------------------------------------------


def scaled(snapshot: MountSnapshot, factor: int, pid: int) -> MountSnapshot:
    """`snapshot` as another process `pid` might report it: every number times `factor`,
    every text and flag different."""

    def scale(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            assert not isinstance(value, type)
            fields = dataclasses.fields(value)
            return dataclasses.replace(
                value, **{f.name: scale(getattr(value, f.name)) for f in fields}
            )
        if isinstance(value, bool):
            return not value
        if isinstance(value, str):
            return f"{value}-of-{pid}"
        if isinstance(value, dict):
            return {key: count * factor for key, count in value.items()}
        if isinstance(value, tuple):
            return tuple(scale(item) for item in value)
        if value is None:
            return None
        return value * factor

    return dataclasses.replace(scale(snapshot), pid=pid)


def figures(snapshot: object, path: str = "") -> Iterator[tuple[type, str, str, object]]:
    """(dataclass, field, dotted path, value) of every figure in `snapshot`."""
    for field in dataclasses.fields(snapshot):  # type: ignore[arg-type]
        value = getattr(snapshot, field.name)
        key = f"{path}.{field.name}" if path else field.name
        if dataclasses.is_dataclass(value):
            yield from figures(value, key)
        else:
            yield type(snapshot), field.name, key, value


def figure(snapshot: object, path: str) -> Any:
    for name in path.split("."):
        snapshot = getattr(snapshot, name)
    return snapshot


@pytest.fixture
def dead_pid() -> int:
    """The pid of a child that has exited and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.fixture
def live_pid() -> Iterator[int]:
    child = subprocess.Popen(["sleep", "300"])
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait()


@pytest.fixture
def own() -> MountSnapshot:
    return dataclasses.replace(distinct_snapshot(), pid=os.getpid())


def publish_three(
    folder: Path, own: MountSnapshot, dead_pid: int, live_pid: int
) -> tuple[StatsShare, MountSnapshot, MountSnapshot]:
    """A dead worker's last snapshot (every number x10) and a live one's (x100), published with
    the main process's own file (x1000, stale: never read) and a corrupt file."""
    share = StatsShare(folder)
    dead = scaled(own, 10, dead_pid)
    live = scaled(own, 100, live_pid)
    live = dataclasses.replace(
        live, storage=dataclasses.replace(live.storage, errors={**live.storage.errors, "New": 1})
    )
    for snapshot in (dead, live, scaled(own, 1000, own.pid)):
        share.publish(snapshot)
    (folder / "stats-1.json").write_text('{"source": "half a fi')
    (folder / "stats-notapid.json").write_text("{}")
    return share, dead, live


def test_each_figure_adds_up_as_classified(tmp_path, own, dead_pid, live_pid):
    share, dead, live = publish_three(tmp_path, own, dead_pid, live_pid)
    total = share.combined(own)
    checked = 0
    for (cls, name, path, mine), (_, _, _, was), (_, _, _, now) in zip(
        figures(own), figures(dead), figures(live), strict=True
    ):
        kind = FIELDS[cls][name]
        if kind is Kind.COUNTER and isinstance(mine, dict):
            want: object = {k: mine[k] + was[k] + now[k] for k in mine} | {"New": 1}
        elif kind is Kind.COUNTER:
            want = pytest.approx(mine + was + now)
        elif kind in (Kind.GAUGE, Kind.SHARE):
            want = pytest.approx(mine + now)
        elif kind is Kind.PEAK:
            want = max(mine, was, now)
        elif kind is Kind.EACH:  # the main process's entries, then the live worker's
            want = mine + now
        else:
            want = mine
        assert figure(total, path) == want, (path, kind)
        checked += 1
    assert checked > 100


def test_counters_add_up_over_every_process_gauges_over_the_live_ones(
    tmp_path, own, dead_pid, live_pid
):
    """The same, figure by figure as a reader would check it, without the table."""
    share, dead, live = publish_three(tmp_path, own, dead_pid, live_pid)
    total = share.combined(own)

    # counters: the dead worker's last counts are kept, so totals never go backwards
    assert total.storage.range_requests == own.storage.range_requests * 111
    assert total.blocks.bytes_served == own.blocks.bytes_served * 111
    assert total.flow.queued_s == pytest.approx(own.flow.queued_s * 111)
    assert total.storage.errors == {
        **{kind: count * 111 for kind, count in own.storage.errors.items()},
        "New": 1,
    }
    # gauges: only what the live processes hold now
    assert total.blocks.fetcher.in_flight == own.blocks.fetcher.in_flight * 101
    assert total.open_files == own.open_files * 101
    assert total.throughput_bytes_per_s == pytest.approx(own.throughput_bytes_per_s * 101)
    # a divided memory budget: the live processes' shares
    assert total.blocks.ram.capacity_bytes == own.blocks.ram.capacity_bytes * 101
    # settings, limits, states and identity: the main process's
    assert total.flow.in_flight_limit == own.flow.in_flight_limit
    assert total.flow.breaker == own.flow.breaker
    assert total.disk is not None
    assert own.disk is not None
    assert total.disk.block_size == own.disk.block_size
    assert total.disk.space.used_bytes == own.disk.space.used_bytes  # one folder, not N
    assert total.disk.space.disk_full is own.disk.space.disk_full
    assert (total.source, total.mountpoint, total.pid, total.uptime_s) == (
        own.source,
        own.mountpoint,
        own.pid,
        own.uptime_s,
    )
    # the highest queue any process saw
    assert total.disk.writer.peak_queued_bytes == own.disk.writer.peak_queued_bytes * 100


def test_a_worker_that_dies_keeps_its_counts_and_loses_its_gauges(tmp_path, own):
    share = StatsShare(tmp_path)
    child = subprocess.Popen(["sleep", "300"])
    try:
        share.publish(scaled(own, 10, child.pid))
        before = share.combined(own)
    finally:
        child.kill()
        child.wait()
    after = share.combined(own)
    assert after.flow.sent == before.flow.sent == own.flow.sent * 11
    assert before.flow.in_flight == own.flow.in_flight * 11
    assert after.flow.in_flight == own.flow.in_flight


def test_alone_the_main_process_reports_its_own(tmp_path, own):
    assert StatsShare(tmp_path).combined(own) == own


def test_a_section_off_in_the_main_process_stays_off_and_one_off_elsewhere_is_skipped(
    tmp_path, own, live_pid
):
    share = StatsShare(tmp_path)
    share.publish(dataclasses.replace(scaled(own, 10, live_pid), disk=None))
    total = share.combined(own)
    assert total.disk == own.disk
    assert total.whole_file is not None
    assert own.whole_file is not None
    assert total.whole_file.downloads == own.whole_file.downloads * 11

    assert share.combined(dataclasses.replace(own, whole_file=None)).whole_file is None


def test_an_unreadable_file_is_ignored_and_logged_once(tmp_path, own, caplog):
    share = StatsShare(tmp_path)
    (tmp_path / "stats-7.json").write_text("not json")
    (tmp_path / "stats-8.json").write_text(
        json.dumps({"answers": 0, "snapshot": {"source": "a different version"}})
    )
    caplog.set_level(logging.DEBUG, logger="blobmount.process_stats")
    assert share.combined(own) == own
    assert share.combined(own) == own
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2, logged
    assert "stats-7.json" in logged[0]
    assert "stats-8.json" in logged[1]
    assert "lack 'mountpoint'" in logged[1]


# -- publishing ----------------------------------------------------------------------------------


def test_publish_replaces_the_file_whole(tmp_path, own):
    """A reader that reads while a process publishes over and over sees one whole snapshot
    or another, never part of one (files of very different sizes make a torn read likely)."""
    share = StatsShare(tmp_path)
    versions = [
        dataclasses.replace(own, pid=4242, uptime_s=float(i), source="x" * (i % 7 * 50_000))
        for i in range(7)
    ]
    share.publish(versions[0])
    path = tmp_path / "stats-4242.json"
    done = threading.Event()

    def publish_many() -> None:
        try:
            for i in range(400):
                share.publish(versions[i % 7])
        finally:
            done.set()

    writer = threading.Thread(target=publish_many)
    writer.start()
    reads = 0
    try:
        while not done.is_set() or reads == 0:
            snapshot = MountSnapshot.from_json(json.loads(path.read_text())["snapshot"])
            assert snapshot == versions[int(snapshot.uptime_s)]
            reads += 1
    finally:
        writer.join()
    assert reads > 1
    # no temporary left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats-4242.json", "stats-requests"]


async def test_publish_every_publishes_until_cancelled_and_once_more(tmp_path, own, autojump_clock):
    share = StatsShare(tmp_path)
    taken = 0

    def snapshot() -> MountSnapshot:
        nonlocal taken
        taken += 1
        return dataclasses.replace(own, pid=4242, uptime_s=float(taken))

    def published() -> float:
        data = json.loads((tmp_path / "stats-4242.json").read_text())
        return MountSnapshot.from_json(data["snapshot"]).uptime_s

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish_every, share, snapshot, 1.0)
        await trio.sleep(2.5)
        assert (taken, published()) == (3, 3.0)  # at 0, 1 and 2 s
        nursery.cancel_scope.cancel()
    assert (taken, published()) == (4, 4.0)  # and once more when cancelled


async def test_publish_every_survives_a_folder_it_cannot_write(
    tmp_path, own, autojump_clock, caplog
):
    share = StatsShare(tmp_path / "gone")
    taken = 0

    def snapshot() -> MountSnapshot:
        nonlocal taken
        taken += 1
        return own

    with trio.move_on_after(5.5):
        await publish_every(share, snapshot, 1.0)
    assert taken == 7  # 6 tries, and the last one when cancelled
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # the refresh counter cannot be made, then publishing
    assert "cannot be refreshed" in warnings[0]
    assert "cannot publish" in warnings[1]


def test_a_report_asks_the_workers_for_fresh_figures(tmp_path, own):
    """A worker publishing once every 100 s still shows a read it served a moment ago: the
    report signals it and waits for its new file."""
    share = StatsShare(tmp_path)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: its figures grow each time they are taken
        status = 1
        os.close(ready_r)
        try:
            taken = 0

            def snapshot() -> MountSnapshot:
                nonlocal taken
                taken += 1
                blocks = dataclasses.replace(own.blocks, reads=taken)
                return dataclasses.replace(own, pid=os.getpid(), blocks=blocks)

            async def work() -> None:
                with trio.move_on_after(20):
                    async with trio.open_nursery() as nursery:
                        await nursery.start(publish_every, share, snapshot, 100.0)
                        os.write(ready_w, b"x")

            trio.run(work)
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"x", "the worker failed (its traceback is above)"
        first = share.combined(own).blocks.reads
        assert first == own.blocks.reads + 1  # the file written when it started
        assert share.refreshed(own, wait_s=10).blocks.reads == own.blocks.reads + 2
        assert share.refreshed(own, wait_s=10).blocks.reads == own.blocks.reads + 3
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(ready_r)
