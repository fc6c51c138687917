"""ReadAheadScheduler on its own, over a real fetcher and the in-memory store: which blocks a
handle keeps, what its read-ahead starts, and the budget counting every byte held or in flight."""

from __future__ import annotations

import trio
import trio.testing

from blobmount.blocks.fetcher import BlockFetcher
from blobmount.blocks.keys import BlobVersion
from blobmount.blocks.ram_tier import RamTier
from blobmount.blocks.scheduler import ReadAheadBudget, ReadAheadScheduler, _requests
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.memory import InMemoryStorageClient

B = 64 * 1024


def make(nursery, *, ahead=0, budget=64 * B, coalesce=4):
    mem = InMemoryStorageClient()
    props = mem.put("blob", bytes(40 * B))
    storage = CountingStorageClient(mem)
    fetcher = BlockFetcher(storage, B, 4, nursery, coalesce_bytes=coalesce * B)
    limit = ReadAheadBudget(budget)
    scheduler = ReadAheadScheduler(fetcher, RamTier(0), limit, B, ahead)
    return scheduler, limit, fetcher, storage, BlobVersion(props.name, props.etag, props.size)


def test_requests_are_runs_of_adjacent_blocks_cut_at_the_limit():
    assert _requests([1, 2, 3, 5, 6, 9], 2) == [[1, 2], [3], [5, 6], [9]]
    assert _requests([], 4) == []


async def test_a_handle_keeps_only_blocks_its_policy_wants(nursery):
    scheduler, budget, _, _, version = make(nursery)
    handle = scheduler.open(version)
    scheduler.on_read(handle, 0, 0)
    assert scheduler.retain(handle, 0, b"x" * B, reserved=0)
    assert budget.used == B  # a block being read may overdraw: it is always kept
    assert not scheduler.retain(handle, 0, b"y" * B, reserved=0)  # already held
    assert budget.try_reserve(B)
    assert not scheduler.retain(handle, 7, b"z" * B, reserved=B)  # not wanted: room given back
    assert budget.used == B
    assert handle.buffer == {0: b"x" * B}


async def test_a_read_moving_on_drops_blocks_behind_it(nursery):
    scheduler, budget, _, _, version = make(nursery)
    handle = scheduler.open(version)
    scheduler.on_read(handle, 0, 0)
    scheduler.retain(handle, 0, b"x" * B, reserved=0)
    scheduler.on_read(handle, 1, 1)
    assert 0 in handle.buffer  # the block before the reader's is kept
    scheduler.on_read(handle, 2, 2)
    assert handle.buffer == {}
    assert budget.used == 0


async def test_a_prefetch_landing_after_close_gives_back_its_reservation(nursery):
    scheduler, budget, _, storage, version = make(nursery, ahead=4)
    handle = scheduler.open(version)
    scheduler.on_read(handle, 0, 0)  # a reader at the start: blocks 1-2 are read ahead
    assert handle.pending == {1, 2}
    assert budget.used == 2 * B  # reserved before the fetch starts
    scheduler.close(handle)
    assert budget.used == 2 * B  # still in flight
    await trio.testing.wait_all_tasks_blocked()
    assert budget.used == 0
    assert storage.range_requests == 1  # the two as one request
    stats = scheduler.statistics()
    assert (stats.prefetch_started, stats.prefetch_wasted, stats.open_handles) == (2, 2, 0)


async def test_prefetched_blocks_land_in_the_buffer(nursery):
    scheduler, budget, _, _, version = make(nursery, ahead=4)
    handle = scheduler.open(version)
    scheduler.on_read(handle, 0, 0)
    await trio.testing.wait_all_tasks_blocked()
    assert sorted(handle.buffer) == sorted(handle.prefetched) == [1, 2]
    assert handle.pending == set()
    assert budget.used == 2 * B
    scheduler.close(handle)
    assert budget.used == 0
    assert scheduler.statistics().prefetch_wasted == 2  # never read


async def test_with_little_room_only_the_readers_next_blocks_go_out(nursery):
    scheduler, budget, fetcher, _, version = make(nursery, ahead=8, budget=B, coalesce=4)
    handle = scheduler.open(version)
    scheduler.on_read(handle, 0, 0)  # wants blocks 1-2, room for one
    assert handle.pending == {1}
    assert budget.used == B
    assert scheduler.statistics().prefetch_skipped_budget == 1
    assert fetcher.statistics().prefetches == 1
