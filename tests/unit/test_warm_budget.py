"""The arithmetic of `blobmount warm`'s stop-when-full: what files cost in the cache, what the
daemon's snapshot says is used, what warm started but the snapshot cannot show yet."""

from __future__ import annotations

import dataclasses

import pytest

from blobmount.blocks.disk_tier import HEADER, DiskTierStats
from blobmount.blocks.disk_writer import DiskWriterStats
from blobmount.cachedir.pruner import PrunerStats
from blobmount.snapshot import MountSnapshot
from blobmount.warm.budget import (
    BLOCK_FILE_OVERHEAD,
    CacheView,
    Ledger,
    Mode,
    NoDiskCache,
    Sizer,
    fits,
)
from blobmount.wholefile.cache import WholeFileStats
from tests.unit.test_snapshot import distinct_snapshot

KiB, MiB = 1024, 1024 * 1024
B = 2 * MiB
UNIT = 4 * KiB
#: a full block's file: the block, its header and key, rounded up to the allocation unit
FULL = B + UNIT


def space(**kw: int) -> PrunerStats:
    base = PrunerStats(
        capacity_bytes=100 * MiB,
        used_bytes=0,
        reserved_bytes=0,
        entries=0,
        prune_start_bytes=90 * MiB,
        prune_goal_bytes=70 * MiB,
        scans=1,
        prune_runs=0,
        pruned_entries=0,
        pruned_bytes=0,
        temporaries_removed=0,
        last_scan_s=0.0,
        disk_full=False,
    )
    return dataclasses.replace(base, **kw)


def writer(**kw: int) -> DiskWriterStats:
    fields = {f.name: 0 for f in dataclasses.fields(DiskWriterStats)}
    return DiskWriterStats(**{**fields, "max_queue_bytes": 64 * MiB, "writers": 2, **kw})


def snapshot(
    disk: DiskTierStats | None = None, whole: WholeFileStats | None = None
) -> MountSnapshot:
    base = distinct_snapshot()
    storage = dataclasses.replace(base.storage, range_requests=7, range_bytes=7 * B)
    return dataclasses.replace(
        base, mountpoint="/mnt/data", storage=storage, disk=disk, whole_file=whole
    )


def block_snapshot(space_kw: dict | None = None, **writer_kw: int) -> MountSnapshot:
    disk = distinct_snapshot().disk
    assert disk is not None
    disk = dataclasses.replace(
        disk,
        cache_dir="/cache",
        block_size=B,
        writer=writer(**writer_kw),
        space=space(**(space_kw or {})),
    )
    return snapshot(disk=disk)


# -- reading a snapshot -------------------------------------------------------------------------


def test_block_mode_view():
    view = CacheView.from_snapshot(
        block_snapshot(
            {"used_bytes": 10 * MiB, "reserved_bytes": MiB},
            queued_blocks=2,
            queued_bytes=3 * MiB,
            dropped_queue_full=1,
            dropped_no_space=2,
            failed=3,
        )
    )
    assert view.mode is Mode.BLOCKS
    assert (view.used_bytes, view.reserved_bytes, view.prune_start_bytes) == (
        10 * MiB,
        MiB,
        90 * MiB,
    )
    assert (view.block_size, view.queued_blocks, view.queued_bytes) == (B, 2, 3 * MiB)
    assert view.not_written_blocks == 6
    assert (view.storage_requests, view.storage_bytes) == (7, 7 * B)


def test_whole_file_mode_view():
    whole = distinct_snapshot().whole_file
    assert whole is not None
    whole = dataclasses.replace(
        whole, cache_dir="/cache", fallbacks=2, cached_opens=5, space=space()
    )
    view = CacheView.from_snapshot(snapshot(whole=whole))
    assert view.mode is Mode.WHOLE_FILE
    assert (view.not_cached_files, view.cached_opens, view.queued_bytes) == (2, 5, 0)


def test_a_mount_without_a_disk_cache_is_refused():
    with pytest.raises(NoDiskCache, match=r"/mnt/data keeps no cache on disk"):
        CacheView.from_snapshot(snapshot())


@pytest.mark.parametrize(
    ("queued", "over"), [(0, False), (32 * MiB, False), (32 * MiB + 1, True), (64 * MiB, True)]
)
def test_the_queue_throttles_past_half_full(queued, over):
    assert CacheView.from_snapshot(block_snapshot(queued_bytes=queued)).queue_over_half is over


# -- costs --------------------------------------------------------------------------------------


def test_the_overhead_allowance_covers_the_block_header():
    assert HEADER.size + 3 * 4 + 1024 < BLOCK_FILE_OVERHEAD  # header, 3 lengths, a long name


@pytest.mark.parametrize(
    ("size", "cost"),
    [
        (0, 0),
        (1, UNIT),
        (UNIT - BLOCK_FILE_OVERHEAD, UNIT),
        (UNIT - BLOCK_FILE_OVERHEAD + 1, 2 * UNIT),
        (B, FULL),
        (B + 1, FULL + UNIT),
        (3 * B, 3 * FULL),
        (3 * B + 10 * KiB, 3 * FULL + 3 * UNIT),
    ],
)
def test_block_mode_cost_is_one_file_per_block(size, cost):
    assert Sizer(Mode.BLOCKS, B, UNIT).cost(size) == cost


@pytest.mark.parametrize(("size", "cost"), [(0, 0), (1, UNIT), (UNIT, UNIT), (B + 1, B + UNIT)])
def test_whole_file_cost_is_the_file_rounded_up(size, cost):
    assert Sizer(Mode.WHOLE_FILE, 0, UNIT).cost(size) == cost


def test_block_mode_cached_part_counts_every_block_a_read_touched():
    sizer = Sizer(Mode.BLOCKS, B, UNIT)
    size = 2 * B + MiB
    assert sizer.cached_part(size, 0) == 0
    assert sizer.cached_part(size, 1) == FULL  # the whole first block was fetched
    assert sizer.cached_part(size, B) == FULL
    assert sizer.cached_part(size, B + 1) == 2 * FULL
    assert sizer.cached_part(size, size) == sizer.cost(size)


def test_usage_counts_queued_blocks_with_their_overhead():
    sizer = Sizer(Mode.BLOCKS, B, UNIT)
    view = CacheView.from_snapshot(
        block_snapshot(
            {"used_bytes": 10 * MiB, "reserved_bytes": FULL}, queued_blocks=3, queued_bytes=3 * B
        )
    )
    assert sizer.usage(view) == 10 * MiB + FULL + 3 * B + 3 * (BLOCK_FILE_OVERHEAD + UNIT)


def test_fits_stops_short_of_the_prune_start():
    # pruning starts when usage reaches the prune start, so reaching it exactly does not fit
    assert fits(50, 20, 29, 100)
    assert not fits(50, 20, 30, 100)
    assert not fits(100, 0, 0, 100)


# -- the ledger ---------------------------------------------------------------------------------


@pytest.fixture
def ledger() -> Ledger:
    return Ledger(Sizer(Mode.BLOCKS, B, UNIT))


def test_a_started_file_is_pending_whole_until_a_snapshot_shows_some(ledger):
    size = 3 * B
    ticket = ledger.start(size)
    assert ledger.pending() == 3 * FULL
    ledger.progress(ticket, B + 1)  # read into the second block: two blocks fetched
    assert ledger.pending() == 3 * FULL  # no snapshot has seen them yet
    mark = ledger.mark()
    ledger.settle(mark)
    assert ledger.pending() == FULL


def test_progress_after_the_mark_stays_pending(ledger):
    ticket = ledger.start(3 * B)
    mark = ledger.mark()
    ledger.progress(ticket, 3 * B)  # read while the snapshot was being taken
    ledger.finish(ticket)
    ledger.settle(mark)
    assert ledger.pending() == 3 * FULL  # that snapshot may predate every block
    ledger.settle(ledger.mark())
    assert ledger.pending() == 0


def test_a_finished_file_leaves_once_a_snapshot_followed(ledger):
    done, failed, running = ledger.start(B), ledger.start(2 * B), ledger.start(B)
    ledger.progress(done, B)
    ledger.finish(done)
    ledger.progress(failed, 1)
    ledger.finish(failed)  # a read error: the rest of it will never come
    assert ledger.pending() == FULL + 2 * FULL + FULL
    ledger.settle(ledger.mark())
    assert ledger.pending() == FULL  # only the one still running
    ledger.finish(running)
    ledger.settle(ledger.mark())
    assert ledger.pending() == 0


def test_whole_file_mode_pending_drops_when_the_open_returns():
    ledger = Ledger(Sizer(Mode.WHOLE_FILE, 0, UNIT))
    ticket = ledger.start(10 * MiB)
    assert ledger.pending() == 10 * MiB
    ledger.progress(ticket, 10 * MiB)  # open returned: downloaded and counted by the daemon
    ledger.settle(ledger.mark())
    assert ledger.pending() == 0
