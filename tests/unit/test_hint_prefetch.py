"""HintPrefetcher on its own, over a real fetcher and the in-memory store: all of a file's blocks
or none, blocks already at hand not fetched again, blocks nobody wants any more not kept."""

from __future__ import annotations

import trio.testing

from blobmount.blocks.fetcher import BlockFetcher
from blobmount.blocks.hint_prefetch import HintPrefetcher
from blobmount.blocks.hinted import HintedBlocks
from blobmount.blocks.keys import BlobVersion, BlockKey
from blobmount.blocks.ram_tier import RamTier
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.memory import InMemoryStorageClient

B = 64 * 1024


def make(nursery, *, limit=16 * B):
    mem = InMemoryStorageClient()
    data = bytes(range(256)) * (3 * B // 256) + b"tail"
    props = mem.put("file", data)
    storage = CountingStorageClient(mem)
    hinted = HintedBlocks(limit)
    ram = RamTier(16 * B)
    fetcher = BlockFetcher(storage, B, 4, nursery)
    prefetcher = HintPrefetcher(hinted, ram, fetcher, B, slots=2)
    return prefetcher, hinted, ram, storage, BlobVersion(props.name, props.etag, props.size), data


async def test_first_blocks_are_fetched_into_the_hinted_store(nursery):
    prefetcher, hinted, _, storage, version, data = make(nursery)
    outcomes: list[bool] = []
    assert prefetcher.fetch_hinted(version, 2, lambda: True, outcomes.append) == 2
    assert hinted.statistics().reserved_bytes == 2 * B  # room taken before the fetches start
    await trio.testing.wait_all_tasks_blocked()
    assert outcomes == [True, True]
    assert hinted.take(BlockKey(version.name, version.etag, 1), B) == data[B : 2 * B]
    assert storage.range_requests == 2
    assert prefetcher.drop_hinted(version) == B  # block 0, still held
    assert hinted.statistics().held_bytes == 0


async def test_without_room_for_every_block_nothing_starts(nursery):
    prefetcher, hinted, _, storage, version, _ = make(nursery, limit=3 * B)
    assert prefetcher.fetch_hinted(version, 10, lambda: True, lambda ok: None) is None
    await trio.testing.wait_all_tasks_blocked()
    assert storage.range_requests == 0
    assert hinted.statistics().reserved_bytes == 0


async def test_blocks_at_hand_are_not_fetched_again(nursery):
    prefetcher, hinted, ram, storage, version, data = make(nursery)
    ram.put(BlockKey(version.name, version.etag, 0), data[:B])
    assert prefetcher.fetch_hinted(version, 10, lambda: True, lambda ok: None) == 3
    assert prefetcher.fetch_hinted(version, 10, lambda: True, lambda ok: None) == 0  # in flight
    await trio.testing.wait_all_tasks_blocked()
    assert prefetcher.fetch_hinted(version, 10, lambda: True, lambda ok: None) == 0  # held
    assert storage.range_requests == 3
    assert hinted.statistics().held_blocks == 3


async def test_a_block_nobody_wants_any_more_is_not_kept(nursery):
    prefetcher, hinted, _, _, version, _ = make(nursery)
    freed: list[int] = []
    hinted.on_free = lambda: freed.append(1)
    outcomes: list[bool] = []
    assert prefetcher.fetch_hinted(version, 1, lambda: False, outcomes.append) == 1
    await trio.testing.wait_all_tasks_blocked()
    assert outcomes == [True]  # the fetch itself went well
    held = hinted.statistics()
    assert (held.held_bytes, held.reserved_bytes) == (0, 0)
    assert freed  # the coordinator hears that room came back
