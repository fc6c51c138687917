"""BlockManager against the in-memory store: bytes, dedupe, read-ahead bounds, RAM LRU."""

import pytest
import trio
import trio.testing

from blobmount.blocks.handles import MAX_CLOSED_STARTS
from blobmount.blocks.keys import BlobVersion
from blobmount.blocks.manager import BlockManager, BlockManagerConfig
from blobmount.errors import BlobChanged, StorageUnavailable
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
    # every block fetched exactly once, read-ahead did the fetching, adjacent blocks together
    assert storage.range_bytes == len(data)
    assert storage.range_requests < 11
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


# -- coalesced read-ahead -------------------------------------------------------------------


class RecordingStorage(CountingStorageClient):
    """Counts, and remembers each GET as (first block, blocks), with a gate to hold GETs."""

    def __init__(self, inner, block):
        super().__init__(inner)
        self.block = block
        self.gets: list[tuple[int, int]] = []
        self.gate = trio.Event()
        self.gate.set()
        self.fail: Exception | None = None

    async def _record(self, start, length):
        self.gets.append((start // self.block, -(-length // self.block)))
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail

    async def get_range(self, name, etag, start, length):
        await self._record(start, length)
        return await super().get_range(name, etag, start, length)

    async def get_range_parts(self, name, etag, start, lengths):
        await self._record(start, sum(lengths))
        return await super().get_range_parts(name, etag, start, lengths)


def make_coalescing(nursery, *, blocks=40, ahead=16, coalesce=4, slots=4, disk=None):
    mem = InMemoryStorageClient()
    data = pattern_bytes("blob", 0, blocks * B - 7)
    props = mem.put("dir/blob", data)
    storage = RecordingStorage(mem, B)
    cfg = BlockManagerConfig(
        block_size=B,
        read_ahead_blocks=ahead,
        prefetch_slots=slots,
        ram_bytes=0,
        read_ahead_budget_bytes=64 * B,
        coalesce_bytes=coalesce * B,
    )
    mgr = BlockManager(storage, cfg, nursery, disk)
    return storage, mgr, BlobVersion(props.name, props.etag, props.size), data


async def read_all(mgr, version, step=B // 2):
    h = mgr.open(version)
    out = bytearray()
    while chunk := await mgr.read(h, len(out), step):
        out += chunk
    mgr.close(h)
    return bytes(out)


async def test_read_ahead_requests_carry_several_blocks(nursery):
    storage, mgr, version, data = make_coalescing(nursery)
    assert await read_all(mgr, version) == data
    await trio.testing.wait_all_tasks_blocked()
    assert storage.range_bytes == len(data)  # each block once
    covered = sorted(i for first, n in storage.gets for i in range(first, first + n))
    assert covered == list(range(40))
    # once the window is wide, read-ahead tops it up a whole request (4 blocks) at a time
    sizes = [n for _, n in storage.gets]
    assert max(sizes) == 4
    assert sum(n == 4 for n in sizes) >= 6, storage.gets
    assert len(storage.gets) <= 16
    assert mgr.fetcher.statistics().coalesced == 40 - len(storage.gets)


async def test_a_failed_coalesced_request_fails_its_blocks_and_later_reads_refetch(nursery):
    storage, mgr, version, data = make_coalescing(nursery, ahead=8)
    h = mgr.open(version)
    assert await mgr.read(h, 0, 10) == data[:10]
    await trio.testing.wait_all_tasks_blocked()  # blocks 1-2 have landed
    storage.fail = StorageUnavailable("503")
    await mgr.read(h, B, 10)  # the window grows: blocks 2.. are prefetched, together, and fail
    await trio.testing.wait_all_tasks_blocked()
    assert storage.gets == [(0, 1), (1, 2), (3, 3)]
    assert mgr.statistics().prefetch_used == 1  # block 1
    storage.fail = None
    # nothing failed stays behind: the reader's own reads fetch the blocks again
    assert await mgr.read(h, 5 * B, 10) == data[5 * B : 5 * B + 10]
    mgr.close(h)
    await trio.testing.wait_all_tasks_blocked()
    assert mgr.statistics().read_ahead_bytes == 0


async def test_demand_read_promotes_a_queued_coalesced_prefetch(nursery):
    storage, mgr, version, data = make_coalescing(nursery, ahead=8, slots=1)
    h = mgr.open(version)
    await mgr.read(h, 0, 10)
    await trio.testing.wait_all_tasks_blocked()  # blocks 1-2 have landed
    storage.gate = trio.Event()  # every GET from now on waits
    await mgr.read(h, B, 10)  # blocks 3-5 take the one slot and hang
    await trio.testing.wait_all_tasks_blocked()
    await mgr.read(h, 2 * B, 10)  # blocks 6-9 as one request, and 10: both queue
    await trio.testing.wait_all_tasks_blocked()
    assert mgr.fetcher.statistics().queued == 5
    assert [n for _, n in storage.gets] == [1, 2, 3]
    with trio.move_on_after(5):
        async with trio.open_nursery() as inner:

            async def reader():
                assert await mgr.read(h, 8 * B, 10) == data[8 * B : 8 * B + 10]

            inner.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            # the demand read took the run holding its block out of the queue: one GET of 4
            assert storage.gets[-1] == (6, 4)
            storage.gate.set()
    assert mgr.fetcher.statistics().promoted == 1, storage.gets
    mgr.close(h)


class DictDisk:
    """A disk tier holding chosen blocks (in memory)."""

    def __init__(self, blocks):
        self.blocks = blocks

    async def get(self, key, size=None):
        return self.blocks.get(key.index)

    def put(self, key, data):
        pass

    def statistics(self):
        return None


async def test_blocks_on_disk_split_a_coalesced_request(nursery):
    data = pattern_bytes("blob", 0, 40 * B - 7)
    disk = DictDisk({5: data[5 * B : 6 * B]})
    storage, mgr, version, data = make_coalescing(nursery, disk=disk, ahead=8)
    assert await read_all(mgr, version) == data
    await trio.testing.wait_all_tasks_blocked()
    covered = sorted(i for first, n in storage.gets for i in range(first, first + n))
    assert covered == [i for i in range(40) if i != 5]
    assert mgr.fetcher.statistics().disk_hits == 1


# -- readers of parts of one file ----------------------------------------------------------------


async def read_part(mgr, handle, start_block, end_block, step=B // 2):
    out = bytearray()
    offset = start_block * B
    while offset < min(end_block * B, handle.version.size):
        out += await mgr.read(handle, offset, min(step, end_block * B - offset))
        offset = start_block * B + len(out)
        await trio.sleep(0)  # let the other readers move too
    return bytes(out)


async def test_readers_of_parts_do_not_read_ahead_into_each_others_parts(nursery):
    # (threads sharing one handle can be taken for one stream while their parts are close, so
    # there the saving is partial)
    storage, mgr, version, data = make_coalescing(nursery, blocks=40, ahead=16)
    parts = [(0, 10), (10, 20), (20, 30), (30, 40)]
    got: dict[int, bytes] = {}

    async def reader(i, first, end):
        handle = mgr.open(version)
        got[i] = await read_part(mgr, handle, first, end)

    async with trio.open_nursery() as inner:
        for i, (first, end) in enumerate(parts):
            inner.start_soon(reader, i, first, end)
    assert b"".join(got[i] for i in range(4)) == data
    await trio.testing.wait_all_tasks_blocked()
    # each block fetched once: nobody's read-ahead ran into the next reader's part
    assert storage.range_bytes == len(data)


async def test_a_tight_read_ahead_budget_still_fetches_whole_requests(nursery):
    # room for six blocks, requests of four: read-ahead waits for room for a whole request
    # rather than sending each block freed as a request of its own
    storage, mgr, version, data = make_coalescing(nursery, blocks=40, ahead=8, coalesce=4)
    mgr.budget.limit = 6 * B
    assert await read_all(mgr, version) == data
    await trio.testing.wait_all_tasks_blocked()
    assert storage.range_bytes == len(data)
    steady = [n for first, n in storage.gets if 6 <= first < 36]  # after the window grew
    assert steady
    assert all(n == 4 for n in steady), storage.gets
    assert len(storage.gets) <= 40 // 4 + 3


async def test_read_ahead_stops_where_a_finished_reader_began(nursery):
    # eight readers of a file's eighths do not finish together: the reader of the next part may
    # be done and gone while this one still reads towards it
    storage, mgr, version, data = make_coalescing(nursery, blocks=20, ahead=8)
    first = mgr.open(version)
    got = bytes(await mgr.read(first, 0, B // 2))
    second = mgr.open(version)
    assert await read_part(mgr, second, 10, 20) == data[10 * B :]
    mgr.close(second)
    got += await read_part(mgr, first, 0, 10)
    assert got[: B // 2] == data[: B // 2]
    await trio.testing.wait_all_tasks_blocked()
    mgr.close(first)
    assert storage.range_bytes == len(data)  # nobody read ahead into the finished part


async def test_read_ahead_stops_where_a_reader_has_only_just_begun(nursery):
    # a neighbour's first read, before it has moved on: its part is not read ahead into either
    storage, mgr, version, data = make_coalescing(nursery, blocks=20, ahead=8)
    second = mgr.open(version)
    assert await mgr.read(second, 10 * B, B // 2) == data[10 * B : 10 * B + B // 2]
    first = mgr.open(version)
    assert await read_part(mgr, first, 0, 10) == data[: 10 * B]
    await trio.testing.wait_all_tasks_blocked()
    assert storage.range_bytes == 11 * B  # blocks 0-9 for the first, block 10 for the second
    for handle in (first, second):
        mgr.close(handle)


async def test_a_handles_own_first_read_does_not_limit_its_read_ahead(nursery):
    # a reader of a footer or an index first (Parquet, zip), then of the file from the start
    storage, mgr, version, data = make_coalescing(nursery, blocks=40, ahead=8)
    reader = mgr.open(version)
    await mgr.read(reader, 20 * B, 100)
    other = mgr.open(version)
    handles = mgr.scheduler.open_handles
    assert handles.others_start_in(other, range(15, 25)) == 20  # another handle stops there
    assert handles.others_start_in(reader, range(15, 25)) is None  # it does not stop itself
    assert await read_part(mgr, reader, 0, 40) == data
    for handle in (reader, other):
        mgr.close(handle)


async def test_starts_of_closed_readers_are_bounded_and_forgotten(nursery):
    _, mgr, version, _ = make_coalescing(nursery, blocks=400, ahead=8)
    keep = mgr.open(version)
    for block in range(1, 300, 3):  # many short-lived handles, each a short stream
        handle = mgr.open(version)
        await mgr.read(handle, block * B, 10)
        await mgr.read(handle, (block + 1) * B, 10)
        mgr.close(handle)
    readers = mgr.scheduler.open_handles.of(version)
    assert readers is not None
    assert len(readers.closed_starts) == MAX_CLOSED_STARTS
    for block in range(300, 400, 2):  # a random read's handle is not remembered once closed
        handle = mgr.open(version)
        await mgr.read(handle, block * B, 10)
        mgr.close(handle)
    assert max(readers.closed_starts) < 300
    mgr.close(keep)
    assert not mgr.scheduler.open_handles  # the file is closed: nothing about it is kept


async def test_a_reader_carrying_on_into_another_part_gets_read_ahead_back(nursery):
    storage, mgr, version, data = make_coalescing(nursery, blocks=40, ahead=8)
    other = mgr.open(version)
    assert await read_part(mgr, other, 20, 23) == data[20 * B : 23 * B]  # started at 20, moved on
    mgr.close(other)  # gone: its start no longer limits anyone
    other = mgr.open(version)
    await read_part(mgr, other, 20, 22)
    before = mgr.statistics().storage_waits
    whole = mgr.open(version)
    assert await read_part(mgr, whole, 0, 40) == data
    # the whole-file reader waits on storage at its start and once at block 20, where its
    # read-ahead stopped; after that it reads ahead again
    waits = mgr.statistics().storage_waits - before
    assert waits <= 4, waits


# -- a one-block file's GET started at its open ----------------------------------------------


def make_small(nursery, *, size=25_000, budget=64 * B, ram=0):
    mem = InMemoryStorageClient()
    data = pattern_bytes("small", 0, size)
    props = mem.put("small", data)
    storage = RecordingStorage(mem, B)
    mgr = BlockManager(storage, BlockManagerConfig(B, 32, 4, ram, budget), nursery)
    return storage, mgr, BlobVersion(props.name, props.etag, props.size), data


@pytest.mark.parametrize("lands", ["before the read", "during the read"])
async def test_a_fetch_at_open_serves_the_read_with_its_one_get(nursery, lands):
    storage, mgr, version, data = make_small(nursery)
    if lands == "during the read":
        storage.gate = trio.Event()  # the GET is held until the read waits on it
    h = mgr.open(version)
    assert mgr.fetch_at_open(h)
    await trio.testing.wait_all_tasks_blocked()
    assert storage.gets == [(0, 1)]  # on the wire before any read
    if lands == "during the read":
        async with trio.open_nursery() as n:
            n.start_soon(lambda: storage.gate.wait())
            result: list[object] = []

            async def read():
                result.append(bytes(await mgr.read(h, 0, 128 * 1024)))

            n.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            assert not result
            storage.gate.set()
        assert result == [data]
    else:
        assert bytes(await mgr.read(h, 0, 128 * 1024)) == data
        assert bytes(await mgr.read(h, 100, 10)) == data[100:110]  # kept for later reads
    assert storage.gets == [(0, 1)]
    stats = mgr.statistics()
    assert stats.prefetch_used == 1
    assert stats.prefetch_wasted == 0
    mgr.close(h)
    assert mgr.statistics().read_ahead_bytes == 0  # its bytes given back to the budget


async def test_a_fetch_at_open_of_a_handle_closed_unread_is_wasted_and_given_back(nursery):
    storage, mgr, version, _ = make_small(nursery)
    h = mgr.open(version)
    assert mgr.fetch_at_open(h)
    await trio.testing.wait_all_tasks_blocked()
    assert mgr.statistics().read_ahead_bytes == version.size
    mgr.close(h)
    stats = mgr.statistics()
    assert stats.read_ahead_bytes == 0
    assert stats.prefetch_wasted == 1


async def test_no_fetch_at_open_for_files_of_several_blocks_empty_files_or_no_budget(nursery):
    storage, mgr, version, _ = make_small(nursery, size=B + 1)
    assert not mgr.fetch_at_open(mgr.open(version))  # a first read may be anywhere
    storage, mgr, version, _ = make_small(nursery, size=0)
    assert not mgr.fetch_at_open(mgr.open(version))
    storage, mgr, version, _ = make_small(nursery, budget=1000)
    assert not mgr.fetch_at_open(mgr.open(version))  # no room in the read-ahead budget
    await trio.testing.wait_all_tasks_blocked()
    assert storage.gets == []


async def test_no_fetch_at_open_of_a_block_in_the_ram_tier(nursery):
    storage, mgr, version, data = make_small(nursery, ram=1 << 20)
    first = mgr.open(version)
    assert bytes(await mgr.read(first, 0, B)) == data
    mgr.close(first)
    assert not mgr.fetch_at_open(mgr.open(version))
    await trio.testing.wait_all_tasks_blocked()
    assert storage.gets == [(0, 1)]


async def test_a_failed_fetch_at_open_leaves_the_read_to_fetch_again(nursery):
    storage, mgr, version, data = make_small(nursery)
    storage.fail = StorageUnavailable("injected")
    h = mgr.open(version)
    assert mgr.fetch_at_open(h)
    await trio.testing.wait_all_tasks_blocked()
    storage.fail = None
    assert bytes(await mgr.read(h, 0, B)) == data
    assert storage.gets == [(0, 1), (0, 1)]
    mgr.close(h)
    assert mgr.statistics().read_ahead_bytes == 0


async def test_no_fetch_at_open_of_a_block_already_in_flight(nursery):
    storage, mgr, version, data = make_small(nursery)
    storage.gate = trio.Event()
    first = mgr.open(version)
    assert mgr.fetch_at_open(first)
    second = mgr.open(version)
    assert not mgr.fetch_at_open(second)  # its read joins the GET on the wire
    storage.gate.set()
    assert bytes(await mgr.read(second, 0, B)) == data
    assert storage.gets == [(0, 1)]
    mgr.close(first)
    mgr.close(second)
