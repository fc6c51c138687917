"""The disk tier against a real directory: round trips, verification of every read, the bounded
write queue, LRU pruning (also across a restart), temporaries left by a crash, concurrent
writers of one block (threads and processes), the block manager on top, and `cache info|clear`."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio

from blobmount.blocks.disk_tier import (
    HEADER,
    DiskTierConfig,
    block_path,
    encode_header,
    key_bytes,
    open_block_disk_tier,
    read_block_file,
)
from blobmount.blocks.disk_writer import DiskWriter, DiskWriterConfig, WriteOutcome
from blobmount.blocks.keys import BlobVersion, BlockKey
from blobmount.blocks.manager import BlockManager, BlockManagerConfig
from blobmount.cachedir.layout import TEMP_PREFIX, CacheLayout, DirLock, atomic_write
from blobmount.cachedir.space import SpaceConfig
from blobmount.cli import main as cli_main
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.memory import InMemoryStorageClient
from blobmount.testing.pattern import pattern_bytes

B = 64 * 1024
LOC = "account/container"


def config(root: Path, **overrides) -> DiskTierConfig:
    values = {
        "enabled": True,
        "root": root,
        "block_size": B,
        "space": SpaceConfig(None, 0),
        "max_queue_bytes": 64 * B,
        "write_threads": 2,
        "read_threads": 2,
        "touch_interval_s": 0.0,
        "rescan_interval_s": 300.0,
        "drain_timeout_s": 10.0,
    }
    values.update(overrides)
    return DiskTierConfig(**values)


def key(i: int, name: str = "dir/blob.bin", etag: str = '"0x1"') -> BlockKey:
    return BlockKey(name, etag, i)


def block(i: int, size: int = B) -> bytes:
    return pattern_bytes(f"block{i}", 0, size)


async def settle(tier) -> None:
    """Wait until the initial scan is done and every queued block has been written."""
    await tier.pruner.ready.wait()
    with trio.fail_after(10):
        while tier.writer.statistics().queued_blocks:
            await trio.sleep(0.005)


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in (root / "blocks").rglob("*") if p.is_file())


def block_files(root: Path) -> list[Path]:
    return [p for p in files_under(root) if re.fullmatch(r"[0-9a-f]{40}", p.name)]


# -- round trips --------------------------------------------------------------------------


async def test_put_then_get_round_trip(tmp_path):
    async with open_block_disk_tier(config(tmp_path / "c"), LOC) as tier:
        assert tier is not None
        for i in range(3):
            tier.put(key(i), block(i))
        await settle(tier)
        for i in range(3):
            assert await tier.get(key(i)) == block(i)
        assert await tier.get(key(9)) is None
        assert await tier.get(key(0, etag='"0x2"')) is None  # another version is another block
        stats = tier.statistics()
    assert (stats.hits, stats.misses, stats.corrupt) == (3, 2, 0)
    assert stats.writer.written == 3
    assert stats.space.entries == 3
    assert len(block_files(tmp_path / "c")) == 3


async def test_short_last_block_round_trips(tmp_path):
    async with open_block_disk_tier(config(tmp_path / "c"), LOC) as tier:
        tier.put(key(7), block(7, 123))
        await settle(tier)
        assert await tier.get(key(7)) == block(7, 123)


async def test_no_name_from_storage_becomes_a_path(tmp_path):
    root = tmp_path / "c"
    async with open_block_disk_tier(config(root), "acct/../../escape") as tier:
        tier.put(key(0, name="../../evil/passwd"), block(0))
        await settle(tier)
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        assert "evil" not in str(rel)
        assert "escape" not in str(rel)
        assert ".." not in rel.parts
        assert path.resolve().is_relative_to(root.resolve())
    (only,) = block_files(root)
    assert re.fullmatch(r"[0-9a-f]{40}", only.name)


async def test_get_serves_a_block_still_in_the_queue(tmp_path):
    async with open_block_disk_tier(config(tmp_path / "c"), LOC) as tier:
        tier.put(key(0), block(0))
        # no checkpoint in between: the writer has not run yet
        assert await tier.get(key(0)) == block(0)
        assert tier.statistics().queue_hits == 1


async def test_queued_blocks_are_written_at_close(tmp_path):
    root = tmp_path / "c"
    async with open_block_disk_tier(config(root), LOC) as tier:
        for i in range(10):
            tier.put(key(i), block(i))
    assert len(block_files(root)) == 10


async def test_a_valid_file_is_not_rewritten(tmp_path):
    root = tmp_path / "c"
    async with open_block_disk_tier(config(root), LOC) as tier:
        tier.put(key(0), block(0))
        await settle(tier)
    async with open_block_disk_tier(config(root), LOC) as tier:
        tier.put(key(0), block(0))
        await settle(tier)
        assert tier.statistics().writer.already_cached == 1


# -- verification ---------------------------------------------------------------------------


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 1000)


def _truncate_into_header(path: Path) -> None:
    os.truncate(path, 10)


def _flip(offset_from_end: int):
    def flip(path: Path) -> None:
        raw = bytearray(path.read_bytes())
        raw[len(raw) - offset_from_end] ^= 0x01
        path.write_bytes(bytes(raw))

    return flip


def _flip_at(offset: int):
    def flip(path: Path) -> None:
        raw = bytearray(path.read_bytes())
        raw[offset] ^= 0x80
        path.write_bytes(bytes(raw))

    return flip


def _extend(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(b"\0")


def _empty(path: Path) -> None:
    path.write_bytes(b"")


CORRUPTIONS = {
    "truncated": _truncate,
    "truncated_header": _truncate_into_header,
    "empty": _empty,
    "extended": _extend,
    "flipped_data_byte": _flip(B // 2),
    "flipped_last_byte": _flip(1),
    "flipped_magic": _flip_at(0),
    "flipped_crc": _flip_at(13),
    "flipped_index": _flip_at(20),
    "flipped_key": _flip_at(HEADER.size + 10),
}


@pytest.mark.parametrize("size", [None, B], ids=["in-a-thread", "in-place"])
@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
async def test_a_damaged_file_is_rejected_removed_and_refilled(tmp_path, corrupt, size):
    root = tmp_path / "c"
    async with open_block_disk_tier(config(root), LOC) as tier:
        tier.put(key(0), block(0))
        await settle(tier)
        path = tier.path(key(0))
        corrupt(path)
        assert await tier.get(key(0), size) is None
        assert not path.exists()
        stats = tier.statistics()
        assert (stats.corrupt, stats.hits) == (1, 0)
        assert stats.inline.reads == (0 if size is None else 1)
        # refetched and put again: valid again
        tier.put(key(0), block(0))
        await settle(tier)
        assert await tier.get(key(0), size) == block(0)


async def test_a_file_of_another_block_under_this_name_is_rejected(tmp_path):
    root = tmp_path / "c"
    async with open_block_disk_tier(config(root), LOC) as tier:
        tier.put(key(0), block(0))
        tier.put(key(1), block(1))
        await settle(tier)
        os.replace(tier.path(key(1)), tier.path(key(0)))
        assert await tier.get(key(0)) is None
        assert tier.statistics().corrupt == 1


async def test_a_symlink_in_the_cache_is_never_followed(tmp_path):
    root = tmp_path / "c"
    target = tmp_path / "secret"
    target.write_bytes(b"not a block")
    async with open_block_disk_tier(config(root), LOC) as tier:
        await settle(tier)
        path = tier.path(key(0))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
        assert await tier.get(key(0)) is None
        assert not path.is_symlink()
    assert target.read_bytes() == b"not a block"


def test_read_keeps_a_good_file_that_replaced_the_bad_one(tmp_path):
    # a rejected file is removed only if it is still the file that was read
    path = tmp_path / "b"
    k = key(0)
    good = encode_header(LOC, k, B, block(0)) + block(0)
    path.write_bytes(good[:-10])
    bad_fd = os.open(path, os.O_RDONLY)
    atomic_write(path, [good])  # a writer replaces it while the reader looks at the old one
    from blobmount.blocks.disk_tier import _remove_if

    assert _remove_if(path, os.fstat(bad_fd)) == 0
    os.close(bad_fd)
    assert read_block_file(path, key_bytes(LOC, k), B, 0, 60.0).data == block(0)


# -- small blocks read in place --------------------------------------------------------------


async def test_small_blocks_are_read_on_the_trio_thread_large_ones_in_a_worker(
    tmp_path, monkeypatch
):
    from blobmount.blocks import disk_tier

    threads: list[str] = []
    real = disk_tier.read_block_file

    def spying(*args):
        threads.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(disk_tier, "read_block_file", spying)
    trio_thread = threading.current_thread().name
    async with open_block_disk_tier(config(tmp_path / "c", inline_read_max_bytes=B), LOC) as tier:
        tier.put(key(0), block(0))
        tier.put(key(1), block(1, 100))
        await settle(tier)
        assert await tier.get(key(0), B) == block(0)  # at the limit: in place
        assert await tier.get(key(1), 100) == block(1, 100)
        assert await tier.get(key(0), B + 1) == block(0)  # over the limit: a worker
        assert await tier.get(key(0)) == block(0)  # size unknown: a worker
        assert tier.statistics().inline.reads == 2
    assert threads[:2] == [trio_thread, trio_thread]
    assert len(threads) == 4
    assert trio_thread not in threads[2:]


async def test_a_slow_read_in_place_sends_reads_to_workers_for_a_while(tmp_path, monkeypatch):
    from blobmount.blocks import disk_tier, inline_reads

    real = disk_tier.read_block_file
    on_trio: list[bool] = []
    trio_thread = threading.current_thread()

    def slow(*args):
        on_trio.append(threading.current_thread() is trio_thread)
        time.sleep(inline_reads.STALL_S * 2)
        return real(*args)

    monkeypatch.setattr(disk_tier, "read_block_file", slow)
    async with open_block_disk_tier(config(tmp_path / "c"), LOC) as tier:
        tier.put(key(0), block(0))
        await settle(tier)
        for _ in range(3):
            assert await tier.get(key(0), B) == block(0)
        stats = tier.statistics().inline
    # the first read was in place and slow; the back-off (1 s) sent the next ones to a worker
    assert on_trio == [True, False, False]
    assert (stats.reads, stats.slow_reads) == (1, 1)


# -- the write queue ------------------------------------------------------------------------


async def test_queue_is_bounded_in_bytes_and_drops_are_counted(nursery):
    release = trio.Event()
    written: list[int] = []

    async def write(k: int, data: bytes) -> WriteOutcome:
        await release.wait()
        written.append(k)
        return WriteOutcome.WRITTEN

    writer: DiskWriter[int] = DiskWriter(DiskWriterConfig(max_queue_bytes=4 * B, writers=2), write)
    nursery.start_soon(writer.run)
    accepted = [writer.submit(i, bytes(B)) for i in range(10)]
    assert accepted == [True] * 4 + [False] * 6
    assert writer.submit(0, bytes(B))  # already queued: not a drop
    await trio.sleep(0.01)
    stats = writer.statistics()
    assert stats.queued_bytes == 4 * B
    assert stats.queued_blocks == 4
    assert (stats.dropped_queue_full, stats.dropped_queue_full_bytes) == (6, 6 * B)
    assert stats.duplicates == 1
    assert writer.pending(3) is not None
    assert writer.pending(5) is None
    release.set()
    with trio.fail_after(5):
        while writer.statistics().queued_blocks:
            await trio.sleep(0.001)
    assert sorted(written) == [0, 1, 2, 3]
    assert writer.submit(11, bytes(B))  # room again once written
    writer.close()
    with trio.fail_after(5):
        await writer.drained.wait()
    stats = writer.statistics()
    assert stats.peak_queued_bytes == 4 * B
    assert (stats.accepted, stats.written, stats.written_bytes) == (5, 5, 5 * B)


async def test_a_block_larger_than_the_queue_is_dropped(nursery):
    async def write(k: int, data: bytes) -> WriteOutcome:
        return WriteOutcome.WRITTEN

    writer: DiskWriter[int] = DiskWriter(DiskWriterConfig(max_queue_bytes=B - 1, writers=1), write)
    nursery.start_soon(writer.run)
    assert not writer.submit(0, bytes(B))
    assert writer.statistics().dropped_queue_full == 1


async def test_put_never_waits_for_the_disk(tmp_path):
    async with open_block_disk_tier(config(tmp_path / "c", max_queue_bytes=3 * B), LOC) as tier:
        assert not inspect.iscoroutinefunction(tier.put)  # it cannot wait for anything
        for i in range(50):
            tier.put(key(i), block(i))
        stats = tier.statistics().writer
        assert stats.accepted == 3
        assert stats.dropped_queue_full == 47
        assert stats.queued_bytes <= 3 * B


async def test_a_failing_write_does_not_stop_the_writers(nursery):
    async def write(k: int, data: bytes) -> WriteOutcome:
        if k == 0:
            raise RuntimeError("bug")
        return WriteOutcome.WRITTEN

    writer: DiskWriter[int] = DiskWriter(DiskWriterConfig(max_queue_bytes=8 * B, writers=1), write)
    nursery.start_soon(writer.run)
    for i in range(3):
        writer.submit(i, bytes(10))
    writer.close()
    with trio.fail_after(5):
        await writer.drained.wait()
    stats = writer.statistics()
    assert (stats.failed, stats.written, stats.queued_bytes) == (1, 2, 0)


# -- space and LRU --------------------------------------------------------------------------


async def _per_block_bytes(root: Path) -> int:
    async with open_block_disk_tier(config(root), LOC) as tier:
        tier.put(key(0), block(0))
        await settle(tier)
        return tier.statistics().space.used_bytes


def _age(path: Path, t: float) -> None:
    os.utime(path, (t, t))


async def test_pruning_removes_least_recently_used_first(tmp_path):
    per_block = await _per_block_bytes(tmp_path / "probe")
    space = SpaceConfig(8 * per_block, 0, prune_threshold=1.0, prune_target=0.5)
    root = tmp_path / "c"
    t0 = time.time() - 1000
    async with open_block_disk_tier(config(root, space=space), LOC) as tier:
        for i in range(7):
            tier.put(key(i), block(i))
            await settle(tier)
            _age(tier.path(key(i)), t0 + i)  # written in order 0..6
        assert tier.statistics().space.used_bytes == 7 * per_block
        assert tier.statistics().space.prune_runs == 0  # below the threshold
        assert await tier.get(key(0)) == block(0)  # a hit: 0 becomes the most recent
        tier.put(key(7), block(7))  # reaches the threshold: prune to half, oldest first
        await settle(tier)
        with trio.fail_after(5):
            while tier.statistics().space.prune_runs == 0:
                await trio.sleep(0.01)
        present = {i for i in range(8) if tier.path(key(i)).exists()}
        stats = tier.statistics()
    assert present == {0, 5, 6, 7}
    assert stats.space.pruned_entries == 4
    assert stats.writer.written == 8
    assert stats.space.used_bytes == 4 * per_block


async def test_pruning_starts_at_the_threshold_in_the_background(tmp_path):
    per_block = await _per_block_bytes(tmp_path / "probe")
    space = SpaceConfig(10 * per_block, 0, prune_threshold=0.5, prune_target=0.2)
    async with open_block_disk_tier(config(tmp_path / "c", space=space), LOC) as tier:
        for i in range(5):
            tier.put(key(i), block(i))
            await settle(tier)
        with trio.fail_after(5):
            while tier.statistics().space.prune_runs == 0:
                await trio.sleep(0.01)
        await settle(tier)
        stats = tier.statistics()
    assert stats.space.used_bytes <= 2 * per_block
    assert stats.writer.dropped_no_space == 0  # nobody waited: there was room all along


async def test_lru_order_survives_a_restart(tmp_path):
    per_block = await _per_block_bytes(tmp_path / "probe")
    root = tmp_path / "c"
    t0 = time.time() - 1000
    async with open_block_disk_tier(config(root), LOC) as tier:
        for i in range(6):
            tier.put(key(i), block(i))
        await settle(tier)
        for i in range(6):
            _age(tier.path(key(i)), t0 + i)
        # the hot set, read last (the hit touches the file)
        assert await tier.get(key(1)) == block(1)
        assert await tier.get(key(2)) == block(2)
    # a new mount with less room prunes at start: the cold blocks go, the hot ones stay
    space = SpaceConfig(6 * per_block, 0, prune_threshold=1.0, prune_target=0.5)
    async with open_block_disk_tier(config(root, space=space), LOC) as tier:
        await settle(tier)
        present = {i for i in range(6) if tier.path(key(i)).exists()}
        for i in present:
            assert await tier.get(key(i)) == block(i)
    assert present == {1, 2, 5}


async def test_touch_is_rate_limited(tmp_path):
    root = tmp_path / "c"
    async with open_block_disk_tier(config(root, touch_interval_s=3600.0), LOC) as tier:
        tier.put(key(0), block(0))
        await settle(tier)
        old = time.time() - 100
        _age(tier.path(key(0)), old)
        assert await tier.get(key(0)) == block(0)
        assert tier.path(key(0)).stat().st_mtime == pytest.approx(old)


async def test_no_room_at_all_skips_writes_and_serves_nothing_wrong(tmp_path, caplog):
    # more reserve than the disk has: capacity 0
    space = SpaceConfig(None, 2**62)
    async with open_block_disk_tier(config(tmp_path / "c", space=space), LOC) as tier:
        for i in range(4):
            tier.put(key(i), block(i))
        await settle(tier)
        assert await tier.get(key(0)) is None
        stats = tier.statistics()
    assert stats.writer.dropped_no_space == 4
    assert stats.writer.written == 0
    assert stats.space.disk_full
    assert block_files(tmp_path / "c") == []
    full = [r for r in caplog.records if "is full" in r.getMessage()]
    assert len(full) == 1  # said once


# -- start, stop, crash leftovers --------------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


async def test_temporaries_of_dead_processes_are_removed_at_start(tmp_path):
    root = tmp_path / "c"
    async with open_block_disk_tier(config(root), LOC) as tier:
        tier.put(key(0), block(0))
        await settle(tier)
        folder = tier.path(key(0)).parent
    dead = folder / f"{TEMP_PREFIX}{_dead_pid()}-0-deadbeef"
    dead.write_bytes(b"half a block")
    alive = folder / f"{TEMP_PREFIX}{os.getppid()}-0-cafecafe"  # a live writer's
    alive.write_bytes(b"being written")
    old = folder / f"{TEMP_PREFIX}{os.getppid()}-1-00000000"
    old.write_bytes(b"ancient")
    _age(old, time.time() - 7200)  # too old to be a live write, whoever's pid it is
    async with open_block_disk_tier(config(root), LOC) as tier:
        await settle(tier)
        assert tier.statistics().space.temporaries_removed == 2
        assert await tier.get(key(0)) == block(0)
    assert not dead.exists()
    assert not old.exists()
    assert alive.exists()


async def test_disabled_or_zero_size_or_unusable_gives_no_tier(tmp_path):
    async with open_block_disk_tier(config(tmp_path / "a", enabled=False), LOC) as tier:
        assert tier is None
    async with open_block_disk_tier(config(tmp_path / "b", space=SpaceConfig(0, 0)), LOC) as tier:
        assert tier is None
    (tmp_path / "file").write_text("x")
    async with open_block_disk_tier(config(tmp_path / "file" / "cache"), LOC) as tier:
        assert tier is None
    assert not (tmp_path / "a").exists()
    assert not (tmp_path / "b").exists()


async def test_errors_in_the_body_come_out_unwrapped(tmp_path):
    with pytest.raises(KeyError):
        async with open_block_disk_tier(config(tmp_path / "c"), LOC):
            raise KeyError("body")


async def test_a_live_tier_holds_the_directory_lock(tmp_path):
    root = tmp_path / "c"
    async with open_block_disk_tier(config(root), LOC):
        lock = DirLock(CacheLayout(root).lock_path)
        assert not lock.acquire(shared=False)
        assert lock.acquire(shared=True)  # other mounts share it
        lock.release()
    lock = DirLock(CacheLayout(root).lock_path)
    assert lock.acquire(shared=False)
    lock.release()


# -- several writers of one block ---------------------------------------------------------------


def test_concurrent_writers_in_threads_never_tear_a_block(tmp_path):
    k = key(3)
    path = block_path(CacheLayout(tmp_path), LOC, k, B)
    expected_key = key_bytes(LOC, k)
    data = block(3)
    stop = threading.Event()
    errors: list[str] = []

    def writer() -> None:
        while not stop.is_set():
            atomic_write(path, [encode_header(LOC, k, B, data), data])

    def reader() -> None:
        while not stop.is_set():
            result = read_block_file(path, expected_key, B, 3, 60.0)
            if result.problem is not None:
                errors.append(result.problem)
            elif result.data is not None and result.data != data:
                errors.append("wrong bytes")

    threads = [threading.Thread(target=writer) for _ in range(4)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert read_block_file(path, expected_key, B, 3, 60.0).data == data
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporaries left


_WRITER_PROCESS = """
import sys, time
from pathlib import Path
from blobmount.blocks.disk_tier import block_path, encode_header
from blobmount.blocks.keys import BlockKey
from blobmount.cachedir.layout import CacheLayout, atomic_write
from blobmount.testing.pattern import pattern_bytes
root, loc, size, seconds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
k = BlockKey("dir/blob.bin", '"0x1"', 3)
data = pattern_bytes("block3", 0, size)
path = block_path(CacheLayout(root), loc, k, size)
end = time.monotonic() + seconds
n = 0
while time.monotonic() < end:
    atomic_write(path, [encode_header(loc, k, size, data), data])
    n += 1
print(n)
"""


def test_two_processes_writing_one_block_at_once(tmp_path):
    k = key(3)
    path = block_path(CacheLayout(tmp_path), LOC, k, B)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER_PROCESS, str(tmp_path), LOC, str(B), "1.5"],
            stdout=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    problems = set()
    reads = 0
    try:
        # read for as long as either writer runs (they start writing once imported)
        while any(p.poll() is None for p in procs):
            result = read_block_file(path, key_bytes(LOC, k), B, 3, 60.0)
            if result.problem is not None:
                problems.add(result.problem)
            elif result.data is not None:
                assert result.data == block(3)
                reads += 1
    finally:
        counts = [int(p.communicate(timeout=30)[0]) for p in procs]
    assert problems == set()
    assert reads > 0
    assert all(n > 10 for n in counts)
    assert [p.name for p in path.parent.iterdir()] == [path.name]


async def test_two_tiers_share_one_directory(tmp_path):
    root = tmp_path / "c"
    async with (
        open_block_disk_tier(config(root), "acct/one") as one,
        open_block_disk_tier(config(root), "acct/two") as two,
    ):
        one.put(key(0), block(0))
        two.put(key(0), block(100))  # same blob name and ETag, other container
        await settle(one)
        await settle(two)
        assert await one.get(key(0)) == block(0)
        assert await two.get(key(0)) == block(100)


# -- with the block manager -------------------------------------------------------------------


async def test_second_read_comes_from_disk_not_storage(tmp_path, nursery):
    mem = InMemoryStorageClient("acct/cont")
    data = pattern_bytes("file", 0, 10 * B + 77)
    props = mem.put("f.bin", data)
    storage = CountingStorageClient(mem)
    version = BlobVersion(props.name, props.etag, props.size)
    cfg = BlockManagerConfig(B, 4, 4, 0, 16 * B)
    async with open_block_disk_tier(config(tmp_path / "c"), mem.location) as tier:
        first = BlockManager(storage, cfg, nursery, tier)
        h = first.open(version)
        assert await first.read(h, 0, len(data)) == data
        first.close(h)
        await settle(tier)
        fetched = storage.range_requests
        assert fetched == 11

        second = BlockManager(storage, cfg, nursery, tier)  # a fresh RAM tier
        h = second.open(version)
        got = b"".join([await second.read(h, off, 10_000) for off in range(0, len(data), 10_000)])
        second.close(h)
        assert got == data
        assert storage.range_requests == fetched
        assert second.statistics().fetcher.disk_hits == 11
        assert tier.statistics().hits == 11


# -- cache info / clear ---------------------------------------------------------------------------


async def _populate(root: Path) -> None:
    async with (
        open_block_disk_tier(config(root), "acct/one") as one,
        open_block_disk_tier(config(root), "acct/two") as two,
    ):
        for i in range(3):
            one.put(key(i), block(i))
        two.put(key(0), block(0))


async def test_cache_info_reports_size_entries_and_containers(tmp_path, capsys):
    root = tmp_path / "c"
    await _populate(root)
    assert cli_main(["cache", "info", str(root), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["entries"] == 4
    assert info["in_use"] is False
    assert info["size_bytes"] >= 4 * B
    by_loc = {loc["location"]: loc["entries"] for loc in info["locations"]}
    assert by_loc == {"acct/one": 3, "acct/two": 1}
    assert cli_main(["cache", "info", str(root)]) == 0
    text = capsys.readouterr().out
    assert "4 entries" in text
    assert "acct/one" in text


async def test_cache_clear_refuses_a_live_mount_unless_forced(tmp_path, capsys):
    root = tmp_path / "c"
    await _populate(root)
    live = DirLock(CacheLayout(root).lock_path)
    assert live.acquire(shared=True)  # what a running mount holds
    try:
        assert cli_main(["cache", "clear", str(root)]) == 1
        assert "in use by a live mount" in capsys.readouterr().err
        assert len(block_files(root)) == 4
        assert cli_main(["cache", "clear", str(root), "--force"]) == 0
        assert len(block_files(root)) == 0
    finally:
        live.release()
    await _populate(root)
    assert cli_main(["cache", "clear", str(root)]) == 0
    assert "removed 4 entries" in capsys.readouterr().out
    assert block_files(root) == []
    assert (root / "CACHEDIR.TAG").exists()


def test_cache_clear_refuses_a_folder_that_is_not_a_cache(tmp_path, capsys):
    (tmp_path / "blocks").mkdir()
    (tmp_path / "blocks" / "precious.txt").write_text("keep me")
    assert cli_main(["cache", "clear", str(tmp_path)]) == 1
    assert "not a blobmount cache" in capsys.readouterr().err
    assert (tmp_path / "blocks" / "precious.txt").exists()


async def test_a_cache_in_a_shared_folder_touches_only_its_own_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.bin").write_bytes(b"x" * 100_000)
    space = SpaceConfig(1, 0)  # nothing fits: prunes everything it owns
    async with open_block_disk_tier(config(tmp_path, space=space), LOC) as tier:
        tier.put(key(0), block(0))
        await settle(tier)
    assert cli_main(["cache", "clear", str(tmp_path)]) == 0
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "data" / "x.bin").stat().st_size == 100_000
