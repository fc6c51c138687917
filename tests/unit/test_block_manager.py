"""BlockManager against the in-memory store: bytes, dedupe, read-ahead bounds, RAM LRU."""

import pytest
import trio
import trio.testing

from blobmount.blocks.keys import BlobVersion
from blobmount.blocks.manager import BlockManager, BlockManagerConfig
from blobmount.errors import BlobChanged
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.memory import InMemoryStorageClient
from blobmount.testing.pattern import pattern_bytes

B = 64 * 1024


def make(nursery, *, size=10 * B + 123, ram=0, ahead=4, budget=None, slots=4):
    mem = InMemoryStorageClient()
    data = pattern_bytes("blob", 0, size)
    props = mem.put("dir/blob", data)
    storage = CountingStorageClient(mem)
    cfg = BlockManagerConfig(
        block_size=B,
        read_ahead_blocks=ahead,
        prefetch_slots=slots,
        ram_bytes=ram,
        read_ahead_budget_bytes=budget if budget is not None else 64 * B,
    )
    mgr = BlockManager(storage, cfg, nursery)
    version = BlobVersion(props.name, props.etag, props.size)
    return mem, storage, mgr, version, data


@pytest.mark.parametrize(
    ("offset", "size"),
    [
        (0, 0),
        (0, 1),
        (1, 1),
        (B - 1, 1),
        (B - 1, 2),
        (B, 1),
        (B + 1, B),
        (0, 3 * B),
        (10 * B, 123),
        (10 * B + 122, 10),
        (10 * B + 123, 5),
        (20 * B, 5),
    ],
)
async def test_read_returns_exact_bytes(nursery, offset, size):
    _, _, mgr, version, data = make(nursery)
    h = mgr.open(version)
    assert await mgr.read(h, offset, size) == data[offset : offset + size]
    mgr.close(h)


async def test_sequential_read_of_whole_file(nursery):
    _, storage, mgr, version, data = make(nursery, ahead=4)
    h = mgr.open(version)
    out = bytearray()
    while chunk := await mgr.read(h, len(out), 4096 * 3):
        out += chunk
    assert out == data
    await trio.testing.wait_all_tasks_blocked()
    mgr.close(h)
    # every block fetched exactly once, read-ahead did the fetching
    assert storage.range_requests == 11
    stats = mgr.statistics()
    assert stats.prefetch_used > 0
    assert stats.read_ahead_bytes == 0


async def test_concurrent_readers_of_one_block_share_one_fetch(nursery):
    _, storage, mgr, version, data = make(nursery, ahead=0)
    handles = [mgr.open(version) for _ in range(10)]
    results = {}

    async def reader(i, h):
        results[i] = await mgr.read(h, 5 * B + 10, 100)

    async with trio.open_nursery() as n:
        for i, h in enumerate(handles):
            n.start_soon(reader, i, h)
    assert all(r == data[5 * B + 10 : 5 * B + 110] for r in results.values())
    assert storage.range_requests == 1


async def test_small_file_takes_one_request(nursery):
    mem = InMemoryStorageClient()
    props = mem.put("small", b"x" * 1000)
    storage = CountingStorageClient(mem)
    mgr = BlockManager(storage, BlockManagerConfig(B, 32, 4, 0, 64 * B), nursery)
    h = mgr.open(BlobVersion(props.name, props.etag, props.size))
    assert await mgr.read(h, 0, 4096) == b"x" * 1000
    await trio.testing.wait_all_tasks_blocked()
    assert storage.range_requests == 1


async def test_random_reads_do_not_prefetch(nursery):
    _, storage, mgr, version, data = make(nursery, size=100 * B, ahead=8)
    h = mgr.open(version)
    for block in (50, 7, 93, 21, 64, 3, 88):
        assert await mgr.read(h, block * B + 5, 10) == data[block * B + 5 : block * B + 15]
    await trio.testing.wait_all_tasks_blocked()
    assert storage.range_requests == 7
    assert mgr.statistics().prefetch_started == 0


async def test_read_ahead_stays_within_budget_when_reader_is_slow(nursery):
    budget = 5 * B
    _, storage, mgr, version, data = make(nursery, size=100 * B, ahead=32, budget=budget)
    handles = [mgr.open(version) for _ in range(4)]
    peak = 0
    for step in range(6):
        for h in handles:
            await mgr.read(h, step * B, B)
            await trio.testing.wait_all_tasks_blocked()
            peak = max(peak, mgr.budget.used)
    # prefetches never exceed the budget; only the blocks being read may overdraw, by at
    # most two blocks per stream (one stream per handle here)
    assert peak <= budget + 2 * B * len(handles)
    assert mgr.statistics().prefetch_skipped_budget > 0
    for h in handles:
        mgr.close(h)
    await trio.testing.wait_all_tasks_blocked()
    assert mgr.budget.used == 0


async def test_ram_tier_is_lru_bounded_in_bytes(nursery):
    _, storage, mgr, version, data = make(nursery, size=10 * B, ahead=0, ram=3 * B)
    h = mgr.open(version)
    for block in range(5):
        await mgr.read(h, block * B, 10)
    stats = mgr.ram.statistics()
    assert stats.used_bytes <= 3 * B
    assert stats.entries == 3
    mgr.close(h)
    h2 = mgr.open(version)
    before = storage.range_requests
    await mgr.read(h2, 4 * B, 10)  # recent: in RAM
    assert storage.range_requests == before
    await mgr.read(h2, 0, 10)  # evicted first
    assert storage.range_requests == before + 1


async def test_zero_ram_tier_caches_nothing(nursery):
    _, storage, mgr, version, _ = make(nursery, ahead=0, ram=0)
    h = mgr.open(version)
    await mgr.read(h, 0, 10)
    mgr.close(h)
    h = mgr.open(version)
    await mgr.read(h, 0, 10)
    assert storage.range_requests == 2
    assert mgr.ram.statistics().entries == 0


async def test_overwritten_blob_fails_pinned_handle(nursery):
    mem, _, mgr, version, data = make(nursery, ahead=0)
    h = mgr.open(version)
    assert await mgr.read(h, 0, 10) == data[:10]
    mem.put("dir/blob", b"new content")
    with pytest.raises(BlobChanged):
        await mgr.read(h, 3 * B, 10)


async def test_demand_read_promotes_a_queued_prefetch(nursery):
    # one prefetch slot, held by a stuck fetch: a demand read must not wait behind the queue
    _, storage, mgr, version, data = make(nursery, size=20 * B, ahead=8, slots=1)
    h = mgr.open(version)
    await mgr.read(h, 0, 10)
    await mgr.read(h, B, 10)
    await trio.testing.wait_all_tasks_blocked()
    assert await mgr.read(h, 9 * B, 10) == data[9 * B : 9 * B + 10]
