"""Whole-file mode against a real cache directory and the in-memory store: one download per
version, reuse across restarts with verification, LRU pruning that spares open files, the
block-mode fallback, failures that leave nothing behind, and the filesystem on top; and the
open's critical path: one GET per cold small file (none per cached one), its bytes served from
memory before its entry is written, and no partial or unchecked file ever under a final name."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import threading
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from blobmount.blocks.inline_reads import InlineReadGate
from blobmount.blocks.keys import BlobVersion
from blobmount.blocks.manager import BlockManager, BlockManagerConfig
from blobmount.cachedir import unnamed
from blobmount.cachedir.layout import TEMP_PREFIX, CacheLayout
from blobmount.cachedir.space import SpaceConfig
from blobmount.download_mode.transfer import TransferError
from blobmount.errors import BlobChanged, StorageUnavailable
from blobmount.fs.errno_map import errno_for
from blobmount.fs.filesystem import BlobFilesystem, FsConfig
from blobmount.fs.readers import BlockReader, WholeFileReader
from blobmount.namespace.inodes import ROOT_INODE
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.faulty import FaultyStorageClient
from blobmount.storage.memory import InMemoryStorageClient
from blobmount.testing.pattern import pattern_bytes
from blobmount.wholefile import entries as wholefile_entries
from blobmount.wholefile import writer as writer_module
from blobmount.wholefile.cache import WholeFileConfig, WholeFileStats, open_whole_file_cache
from blobmount.wholefile.fetch import md5_keeping_gil
from blobmount.wholefile.writer import EntryWrite, EntryWriter

MiB = 1024 * 1024
PART = 256 * 1024
LOC = "account/container"


def config(root: Path, cache_size: int | None = None) -> WholeFileConfig:
    return WholeFileConfig(
        root=root,
        space=SpaceConfig(cache_size, 0),
        download_slots=4,
        part_size=PART,
    )


def version(mem: InMemoryStorageClient, name: str) -> BlobVersion:
    props = mem._props[name]
    return BlobVersion(name, props.etag, props.size)


def entries(root: Path) -> list[Path]:
    return [Path(e.path) for e in CacheLayout(root).entries()]


def temporaries(root: Path) -> list[str]:
    return [name for _, _, names in os.walk(root) for name in names if name.startswith(TEMP_PREFIX)]


async def read_all(cache, copy) -> bytes:
    reader = WholeFileReader(cache, copy)
    data = bytes(await reader.read(0, copy.size + 10))
    reader.close()
    return data


async def test_open_downloads_once_and_reads_locally(tmp_path):
    mem = InMemoryStorageClient()
    data = pattern_bytes("big.bin", 0, 3 * MiB + 123)
    mem.put("big.bin", data)
    storage = CountingStorageClient(mem)
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None
        copy = await cache.open(version(mem, "big.bin"))
        assert copy is not None
        assert await read_all(cache, copy) == data
        parts = -(-len(data) // PART)
        assert storage.statistics().range_requests == parts
        # reads at any offset, past the end, zero length
        reader = WholeFileReader(cache, await cache.open(version(mem, "big.bin")))
        assert bytes(await reader.read(1_000_000, 5000)) == data[1_000_000:1_005_000]
        assert bytes(await reader.read(len(data) - 3, 100)) == data[-3:]
        assert await reader.read(len(data) + 1, 100) == b""
        reader.close()
        # reopened later: no new GETs
        again = await cache.open(version(mem, "big.bin"))
        assert await read_all(cache, again) == data
        assert storage.statistics().range_requests == parts
        stats = cache.statistics()
        assert (stats.downloads, stats.downloaded_bytes) == (1, len(data))
        assert stats.cached_opens == 2
        assert stats.open_copies == 0
    assert len(entries(tmp_path)) == 1
    assert temporaries(tmp_path) == []


async def _open_concurrently(
    tmp_path: Path, name: str, size: int, opens: int
) -> tuple[bytes, CountingStorageClient, WholeFileStats, list[bytes]]:
    """Open and read `name` (`size` bytes) `opens` times at once through a new cache: its
    bytes, the storage, the cache's statistics after the reads, and what each read got."""
    mem = InMemoryStorageClient()
    data = pattern_bytes(name, 0, size)
    mem.put(name, data)
    storage = CountingStorageClient(mem)
    got: list[bytes] = []
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None

        async def opener() -> None:
            copy = await cache.open(version(mem, name))
            got.append(await read_all(cache, copy))

        async with trio.open_nursery() as nursery:
            for _ in range(opens):
                nursery.start_soon(opener)
        stats = cache.statistics()
    return data, storage, stats, got


async def test_concurrent_opens_share_one_download(tmp_path):
    data, storage, stats, got = await _open_concurrently(tmp_path, "shared.bin", 2 * MiB, 6)
    assert stats.downloads == 1
    assert stats.shared_opens == 5
    assert stats.open_copies == 0
    assert got == [data] * 6
    assert storage.statistics().range_requests == -(-len(data) // PART)


async def test_restart_reuses_the_copy_and_verifies_it_once(tmp_path):
    mem = InMemoryStorageClient()
    data = pattern_bytes("keep.bin", 0, MiB)
    mem.put("keep.bin", data)
    storage = CountingStorageClient(mem)
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None
        cache.release(await cache.open(version(mem, "keep.bin")))
    before = storage.statistics()
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None
        for _ in range(3):
            copy = await cache.open(version(mem, "keep.bin"))
            assert await read_all(cache, copy) == data
        stats = cache.statistics()
        assert (stats.downloads, stats.cached_opens, stats.corrupt) == (0, 3, 0)
    after = storage.statistics()
    assert after.range_requests == before.range_requests
    # the Content-MD5 check costs one properties request, once
    assert after.properties_requests == before.properties_requests + 1


@pytest.mark.parametrize("damage", ["flip", "truncate"])
async def test_a_damaged_copy_is_downloaded_again(tmp_path, damage):
    mem = InMemoryStorageClient()
    data = pattern_bytes("hurt.bin", 0, MiB)
    # without Content-MD5 only the size can be checked
    mem.put("hurt.bin", data, md5=damage == "flip")
    storage = CountingStorageClient(mem)
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None
        cache.release(await cache.open(version(mem, "hurt.bin")))
    (path,) = entries(tmp_path)
    with open(path, "r+b") as f:
        if damage == "flip":
            f.seek(1000)
            f.write(bytes([data[1000] ^ 0xFF]))
        else:
            f.truncate(1000)
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None
        copy = await cache.open(version(mem, "hurt.bin"))
        assert await read_all(cache, copy) == data
        stats = cache.statistics()
        assert (stats.corrupt, stats.downloads) == (1, 1)


async def test_lru_pruning_spares_open_files(tmp_path):
    mem = InMemoryStorageClient()
    for name in "abc":
        mem.put(name, pattern_bytes(name, 0, MiB))
    storage = CountingStorageClient(mem)
    # room for two files
    async with open_whole_file_cache(storage, config(tmp_path, 2 * MiB + 64 * 1024), LOC) as c:
        assert c is not None
        a = await c.open(version(mem, "a"))  # stays open
        c.release(await c.open(version(mem, "b")))
        c_copy = await c.open(version(mem, "c"))  # needs room: b goes, not the open a
        assert c_copy is not None
        names = {p.name for p in entries(tmp_path)}
        assert Path(c.path(version(mem, "a"))).name in names
        assert Path(c.path(version(mem, "b"))).name not in names
        assert await read_all(c, a) == mem._data["a"]
        assert await read_all(c, c_copy) == mem._data["c"]
        # everything open: a third file cannot fit, and nothing open was removed
        a2, c2 = await c.open(version(mem, "a")), await c.open(version(mem, "c"))
        assert await c.open(version(mem, "b")) is None
        assert c.statistics().fallbacks == 1
        assert len(entries(tmp_path)) == 2
        c.release(a2)
        c.release(c2)


async def test_a_file_larger_than_the_cache_is_not_cached(tmp_path):
    mem = InMemoryStorageClient()
    mem.put("small", pattern_bytes("small", 0, 100_000))
    mem.put("huge", pattern_bytes("huge", 0, 3 * MiB))
    storage = CountingStorageClient(mem)
    async with open_whole_file_cache(storage, config(tmp_path, 2 * MiB), LOC) as cache:
        assert cache is not None
        cache.release(await cache.open(version(mem, "small")))
        assert await cache.open(version(mem, "huge")) is None
        assert cache.statistics().fallbacks == 1
        # nothing was pruned to try, and nothing of the big file was fetched
        assert len(entries(tmp_path)) == 1
    assert storage.statistics().range_requests == 1


async def test_a_failed_download_fails_the_open_and_leaves_nothing(tmp_path):
    mem = InMemoryStorageClient()
    mem.put("flaky.bin", pattern_bytes("flaky.bin", 0, 2 * MiB))
    faulty = FaultyStorageClient(mem)
    faulty.fail_next("get_range", 3, lambda: StorageUnavailable("503 from the test"))
    async with open_whole_file_cache(faulty, config(tmp_path), LOC) as cache:
        assert cache is not None
        with pytest.raises(StorageUnavailable) as raised:
            await cache.open(version(mem, "flaky.bin"))
        assert errno_for(raised.value)[0] == errno.EIO
        assert cache.statistics().failed_downloads == 1
        assert entries(tmp_path) == []
        assert temporaries(tmp_path) == []
        assert cache.statistics().space.reserved_bytes == 0
        # the next open tries again, and works
        faulty.clear_faults()
        copy = await cache.open(version(mem, "flaky.bin"))
        assert await read_all(cache, copy) == mem._data["flaky.bin"]


async def test_a_blob_deleted_during_the_download_fails_cleanly(tmp_path):
    mem = InMemoryStorageClient()
    mem.put("gone.bin", pattern_bytes("gone.bin", 0, 2 * MiB))
    v = version(mem, "gone.bin")
    faulty = FaultyStorageClient(mem)

    def delete_then_fail() -> BaseException:
        mem.delete("gone.bin")
        return StorageUnavailable("connection reset")

    faulty.fail_next("get_range", 1, delete_then_fail)
    async with open_whole_file_cache(faulty, config(tmp_path), LOC) as cache:
        assert cache is not None
        with pytest.raises(Exception) as raised:
            await cache.open(v)
        assert errno_for(raised.value)[0] in (errno.EIO, errno.ENOENT)
    assert entries(tmp_path) == []
    assert temporaries(tmp_path) == []


async def test_an_abandoned_download_is_cancelled_and_cleaned_up(tmp_path):
    mem = InMemoryStorageClient()
    mem.put("slow.bin", pattern_bytes("slow.bin", 0, 4 * MiB))
    faulty = FaultyStorageClient(mem)

    async def stall() -> None:
        await trio.sleep_forever()

    class Stalling(FaultyStorageClient):
        async def get_range(self, name, etag, start, length):
            if start > 0:
                await stall()
            return await super().get_range(name, etag, start, length)

    stalling = Stalling(mem)
    async with open_whole_file_cache(stalling, config(tmp_path), LOC) as cache:
        assert cache is not None
        with trio.move_on_after(0.5):
            await cache.open(version(mem, "slow.bin"))
        with trio.fail_after(5):
            while cache._downloads:
                await trio.sleep(0.01)
        assert temporaries(tmp_path) == []
        assert cache.statistics().space.reserved_bytes == 0
    assert entries(tmp_path) == []
    del faulty


async def test_a_new_version_replaces_the_old_copy(tmp_path):
    mem = InMemoryStorageClient()
    mem.put("v.bin", b"one" * 1000)
    storage = CountingStorageClient(mem)
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None
        old = version(mem, "v.bin")
        cache.release(await cache.open(old))
        mem.put("v.bin", b"two" * 2000)
        new = version(mem, "v.bin")
        copy = await cache.open(new)
        assert await read_all(cache, copy) == b"two" * 2000
        with trio.fail_after(5):
            # both entries are written in the background (the old one maybe before the new
            # version was seen, then removed)
            await cache.writer.settled()
            while Path(cache.path(old)).exists():
                await trio.sleep(0.01)
        assert [p.name for p in entries(tmp_path)] == [Path(cache.path(new)).name]


# -- the filesystem on top -----------------------------------------------------------------


async def test_filesystem_reads_whole_files_and_streams_what_does_not_fit(nursery, tmp_path):
    mem = InMemoryStorageClient()
    mem.put("db/small.sqlite", pattern_bytes("small", 0, 300_000))
    mem.put("db/huge.bin", pattern_bytes("huge", 0, 3 * MiB))
    storage = CountingStorageClient(mem)
    b = 64 * 1024
    blocks = BlockManager(storage, BlockManagerConfig(b, 4, 4, 4 * b, 16 * b), nursery)
    cfg = FsConfig("", None, 1000, 1000, 0o444, 0o555, 1.7e9, b)
    async with open_whole_file_cache(storage, config(tmp_path, 2 * MiB), LOC) as cache:
        fs = BlobFilesystem(storage, blocks, cfg, cache)
        folder = await fs.lookup(ROOT_INODE, "db")
        for name, mode in (("small.sqlite", WholeFileReader), ("huge.bin", BlockReader)):
            node = await fs.lookup(folder.inode, name)
            opened = await fs.open(node.inode, os.O_RDONLY)
            assert isinstance(fs._files[opened.fh].reader, mode)
            assert opened.keep_cache
            got = bytes(await fs.read(opened.fh, 1000, 70_000))
            assert got == mem._data[f"db/{name}"][1000:71_000]
            fs.release(opened.fh)
        assert cache is not None
        assert cache.statistics().open_copies == 0
        assert cache.statistics().fallbacks == 1


async def test_the_cache_does_not_start_writeback_as_downloads_do(tmp_path, monkeypatch):
    # measured: early writeback made whole-file opens about 20% slower, and the cache never
    # syncs, so it gains nothing from it (the download command does: its final syncfs)
    from blobmount.download_mode import staging

    started: list[int] = []

    def record(fd: int, offset: int, length: int) -> bool:
        started.append(length)
        return True

    monkeypatch.setattr(staging, "start_writeback", record)
    mem = InMemoryStorageClient()
    data = pattern_bytes("big.bin", 0, 3 * MiB)
    mem.put("big.bin", data)
    async with open_whole_file_cache(mem, config(tmp_path), LOC) as cache:
        assert cache is not None
        copy = await cache.open(version(mem, "big.bin"))
        assert copy is not None
        assert await read_all(cache, copy) == data
    assert started == []


# -- the open's critical path: one request, bytes served before the entry is written ---------


def requests(storage: CountingStorageClient) -> tuple[int, int, int]:
    """(list, properties, range) requests so far."""
    s = storage.statistics()
    return s.list_requests, s.properties_requests, s.range_requests


async def test_a_cold_small_file_costs_one_get_and_a_cached_one_none(tmp_path):
    mem = InMemoryStorageClient()
    names = [f"img/{i}.jpg" for i in range(5)]
    for name in names:
        mem.put(name, pattern_bytes(name, 0, 8192 + len(name)))
    storage = CountingStorageClient(mem)
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None
        for epoch in range(3):
            for name in names:
                before = requests(storage)
                copy = await cache.open(version(mem, name))
                assert copy is not None
                after = requests(storage)
                # cold: exactly one GET, no properties request; later epochs: nothing at all
                assert after == (before[0], before[1], before[2] + (epoch == 0))
                assert await read_all(cache, copy) == mem._data[name]
        stats = cache.statistics()
        assert (stats.downloads, stats.cached_opens) == (5, 10)
    assert len(entries(tmp_path)) == 5
    assert temporaries(tmp_path) == []


async def test_the_filesystem_open_of_a_small_file_is_one_get(nursery, tmp_path):
    mem = InMemoryStorageClient()
    mem.put("d/a.bin", pattern_bytes("a", 0, 25_000))
    storage = CountingStorageClient(mem)
    b = 64 * 1024
    blocks = BlockManager(storage, BlockManagerConfig(b, 4, 4, 4 * b, 16 * b), nursery)
    cfg = FsConfig("", None, 1000, 1000, 0o444, 0o555, 1.7e9, b)
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        fs = BlobFilesystem(storage, blocks, cfg, cache)
        folder = await fs.lookup(ROOT_INODE, "d")
        node = await fs.lookup(folder.inode, "a.bin")
        for cold in (True, False):
            before = requests(storage)
            opened = await fs.open(node.inode, os.O_RDONLY)
            got = bytes(await fs.read(opened.fh, 0, 100_000))
            fs.release(opened.fh)
            assert got == mem._data["d/a.bin"]
            assert requests(storage) == (before[0], before[1], before[2] + cold)


async def test_a_first_open_of_a_small_file_hands_its_bytes_for_the_kernels_page_cache(
    nursery, tmp_path
):
    # the inode's first open: the kernel holds none of its pages, and gets them all with the
    # open (fuse_ops stores them), so its reads need no READ. A reopen, a file too big to be
    # held in memory, and block mode hand nothing.
    mem = InMemoryStorageClient()
    small = pattern_bytes("s", 0, 25_000)
    mem.put("s.bin", small)
    mem.put("big.bin", pattern_bytes("big", 0, 300_000))  # above MEMORY_MAX_BYTES
    storage = CountingStorageClient(mem)
    b = 64 * 1024
    blocks = BlockManager(storage, BlockManagerConfig(b, 4, 4, 4 * b, 16 * b), nursery)
    cfg = FsConfig("", None, 1000, 1000, 0o444, 0o555, 1.7e9, b)
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None
        fs = BlobFilesystem(storage, blocks, cfg, cache)
        node = await fs.lookup(ROOT_INODE, "s.bin")
        first = await fs.open(node.inode, os.O_RDONLY)
        assert first.preload == small
        assert first.keep_cache  # or the open's answer would drop the stored pages
        assert cache.statistics().preloaded_opens == 1
        assert cache.served_bytes == len(small)
        again = await fs.open(node.inode, os.O_RDONLY)  # the kernel may hold its pages
        assert again.preload is None
        fs.release(first.fh)
        fs.release(again.fh)
        big = await fs.lookup(ROOT_INODE, "big.bin")
        opened = await fs.open(big.inode, os.O_RDONLY)
        assert opened.preload is None
        fs.release(opened.fh)
        assert cache.statistics().preloaded_opens == 1
    block_fs = BlobFilesystem(storage, blocks, cfg)
    node = await block_fs.lookup(ROOT_INODE, "s.bin")
    opened = await block_fs.open(node.inode, os.O_RDONLY)
    assert opened.preload is None
    block_fs.release(opened.fh)


async def test_a_small_file_is_served_from_memory_before_its_entry_is_written(
    tmp_path, monkeypatch
):
    mem = InMemoryStorageClient()
    data = pattern_bytes("now.bin", 0, 30_000)
    mem.put("now.bin", data)
    disk_free = threading.Event()
    real_write = wholefile_entries.put_entry

    def slow_write(path, data):
        disk_free.wait(10)  # a disk that takes its time
        return real_write(path, data)

    monkeypatch.setattr(wholefile_entries, "put_entry", slow_write)

    class Busy(InMemoryStorageClient):
        """Another file's GET still in flight: a busy mount, whose writes go to a thread."""

        other_may_finish = trio.Event()

        async def get_range_with_props(self, name, etag, start, length):
            if name == "other.bin":
                await self.other_may_finish.wait()
            return await super().get_range_with_props(name, etag, start, length)

    busy = Busy()
    busy._data, busy._props, busy._names = mem._data, mem._props, mem._names
    mem.put("other.bin", b"other")
    async with open_whole_file_cache(busy, config(tmp_path), LOC) as cache:
        assert cache is not None
        cache.writer.gate = InlineReadGate(max_bytes=0)  # a slow disk: writes in the thread

        async def open_other() -> None:
            cache.release(await cache.open(version(mem, "other.bin")))

        cache._nursery.start_soon(open_other)
        with trio.fail_after(5):
            while not cache._downloads:
                await trio.sleep(0)
            copy = await cache.open(version(mem, "now.bin"))
        # answered without waiting for the disk, and read from the bytes in memory
        assert copy is not None
        assert copy.writing
        reader = WholeFileReader(cache, copy)
        assert bytes(await reader.read(100, 1000)) == data[100:1100]
        await trio.sleep(0.05)
        assert entries(tmp_path) == []  # nothing under a final name until it is whole
        disk_free.set()
        with trio.fail_after(5):
            await cache.writer.settled()
        entry = Path(cache.path(version(mem, "now.bin")))
        assert [p.name for p in entries(tmp_path)] == [entry.name]
        Busy.other_may_finish.set()
        with trio.fail_after(5):
            while cache._downloads:
                await trio.sleep(0.001)
            await cache.writer.settled()
        assert entry.read_bytes() == data
        assert bytes(await reader.read(29_990, 100)) == data[29_990:]
        reader.close()
        assert cache.statistics().open_copies == 0
        assert cache.statistics().space.reserved_bytes == 0
    assert temporaries(tmp_path) == []


async def test_concurrent_opens_of_a_small_file_share_one_get(tmp_path):
    data, storage, stats, got = await _open_concurrently(tmp_path, "hot.bin", 20_000, 8)
    assert (stats.downloads, stats.shared_opens, stats.open_copies) == (1, 7, 0)
    assert got == [data] * 8
    assert requests(storage) == (0, 0, 1)
    assert len(entries(tmp_path)) == 1


async def test_a_small_file_read_just_before_unmount_is_still_cached(tmp_path):
    mem = InMemoryStorageClient()
    mem.put("last.bin", pattern_bytes("last.bin", 0, 10_000))
    storage = CountingStorageClient(mem)
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None
        cache.release(await cache.open(version(mem, "last.bin")))
        # unmounting now, before the entry's write had a turn
    assert len(entries(tmp_path)) == 1
    assert temporaries(tmp_path) == []
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None
        before = requests(storage)
        copy = await cache.open(version(mem, "last.bin"))
        assert await read_all(cache, copy) == mem._data["last.bin"]
        # no GET; the one-time Content-MD5 check of a copy from an earlier mount
        assert requests(storage) == (before[0], before[1] + 1, before[2])
        assert cache.statistics().downloads == 0


@pytest.mark.parametrize("size", [5_000, 400_000, 900_000])
async def test_wrong_bytes_are_never_cached(tmp_path, size):
    # one size per path (part size 512 KiB here): into memory, one GET to disk, parts
    mem = InMemoryStorageClient()
    data = pattern_bytes("bad.bin", 0, size)
    props = mem.put("bad.bin", data)
    # storage says the blob's MD5 is another one: the bytes received are not the blob's
    mem._props["bad.bin"] = dataclasses.replace(props, content_md5=hashlib.md5(b"x").digest())
    cfg = dataclasses.replace(config(tmp_path), part_size=512 * 1024)
    async with open_whole_file_cache(mem, cfg, LOC) as cache:
        assert cache is not None
        # whatever the path, the bytes are checked before the open returns: it fails
        with pytest.raises(TransferError) as raised:
            await cache.open(version(mem, "bad.bin"))
        failures = 1
        assert errno_for(raised.value)[0] == errno.EIO
        await trio.sleep(0.01)
        stats = cache.statistics()
        assert stats.failed_downloads == failures
        assert (stats.open_copies, stats.space.reserved_bytes) == (0, 0)
        assert entries(tmp_path) == []
        assert temporaries(tmp_path) == []


async def test_a_failed_get_of_a_small_file_fails_the_open_and_leaves_nothing(tmp_path):
    mem = InMemoryStorageClient()
    mem.put("flaky.jpg", pattern_bytes("flaky.jpg", 0, 9_000))
    faulty = FaultyStorageClient(mem)
    faulty.fail_next("get_range", 1, lambda: StorageUnavailable("503 from the test"))
    storage = CountingStorageClient(faulty)
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None
        with pytest.raises(StorageUnavailable) as raised:
            await cache.open(version(mem, "flaky.jpg"))
        assert errno_for(raised.value)[0] == errno.EIO
        assert requests(storage) == (0, 0, 1)
        stats = cache.statistics()
        assert (stats.failed_downloads, stats.space.reserved_bytes) == (1, 0)
        assert entries(tmp_path) == []
        assert temporaries(tmp_path) == []
        copy = await cache.open(version(mem, "flaky.jpg"))
        assert await read_all(cache, copy) == mem._data["flaky.jpg"]
        assert requests(storage) == (0, 0, 2)


class FirstGetStalls(CountingStorageClient):
    """Counts GETs; the first one hangs until it is cancelled (a GET stuck in flight)."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.first_in_flight = trio.Event()
        self.first_cancelled = False
        self._first = True

    async def get_range_with_props(self, name, etag, start, length):
        if self._first:
            self._first = False
            self.range_requests += 1
            self.first_in_flight.set()
            try:
                await trio.sleep_forever()
            finally:
                self.first_cancelled = True
        return await super().get_range_with_props(name, etag, start, length)


async def test_an_interrupted_open_of_a_small_file_stops_its_get_and_the_others_get_the_file(
    tmp_path,
):
    # a small file's GET runs in the task of the open that started it: interrupting that open
    # (a FUSE request interrupted) stops it, and one of the opens that had joined it starts
    # another GET, for them all
    mem = InMemoryStorageClient()
    data = pattern_bytes("hot.jpg", 0, 20_000)
    mem.put("hot.jpg", data)
    storage = FirstGetStalls(mem)
    got: list[bytes] = []
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None

        async def joiner() -> None:
            copy = await cache.open(version(mem, "hot.jpg"))
            got.append(await read_all(cache, copy))

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                interrupted = trio.CancelScope()

                async def starter() -> None:
                    with interrupted:
                        await cache.open(version(mem, "hot.jpg"))
                    assert interrupted.cancelled_caught

                nursery.start_soon(starter)
                await storage.first_in_flight.wait()
                for _ in range(3):
                    nursery.start_soon(joiner)
                await trio.testing.wait_all_tasks_blocked()  # they have joined it
                assert cache.statistics().shared_opens == 3
                interrupted.cancel()
            await cache.writer.settled()
        assert storage.first_cancelled
        assert got == [data] * 3
        assert requests(storage) == (0, 0, 2)
        stats = cache.statistics()
        assert (stats.downloads, stats.failed_downloads, stats.open_copies) == (1, 0, 0)
        assert stats.space.reserved_bytes == 0
        assert cache._slots.borrowed_tokens == 0
    assert len(entries(tmp_path)) == 1
    assert temporaries(tmp_path) == []


async def test_a_small_file_every_open_gave_up_on_leaves_nothing_behind(tmp_path):
    mem = InMemoryStorageClient()
    mem.put("gave-up.jpg", pattern_bytes("gave-up.jpg", 0, 20_000))
    storage = FirstGetStalls(mem)
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(cache.open, version(mem, "gave-up.jpg"))
                await storage.first_in_flight.wait()
                await trio.testing.wait_all_tasks_blocked()  # the others have joined it
                nursery.cancel_scope.cancel()  # every open gives up
            await trio.testing.wait_all_tasks_blocked()
        assert storage.first_cancelled
        assert (cache._downloads, cache._open, cache._pinned) == ({}, {}, set())
        stats = cache.statistics()
        assert (stats.downloads, stats.failed_downloads) == (0, 0)
        assert stats.space.reserved_bytes == 0
        assert cache._slots.borrowed_tokens == 0
        assert temporaries(tmp_path) == []
    assert entries(tmp_path) == []
    assert requests(storage) == (0, 0, 1)


async def test_a_blob_changed_since_the_listing_fails_the_open(tmp_path):
    mem = InMemoryStorageClient()
    mem.put("moved.bin", b"old" * 100)
    old = version(mem, "moved.bin")
    mem.put("moved.bin", b"new" * 100)
    async with open_whole_file_cache(mem, config(tmp_path), LOC) as cache:
        assert cache is not None
        with pytest.raises(BlobChanged):
            await cache.open(old)
    assert entries(tmp_path) == []
    assert temporaries(tmp_path) == []


@pytest.mark.parametrize("publish", ["unnamed", "temporary"])
async def test_a_failed_write_leaves_no_entry_and_the_open_still_reads(
    tmp_path, monkeypatch, publish
):
    # the disk fails as the whole file is to get its final name (as a crash there would stop
    # it): no file may be left under the final name, nor a temporary. "unnamed": an O_TMPFILE
    # file whose link fails; "temporary": where the file system has no O_TMPFILE, a named
    # temporary whose rename fails
    mem = InMemoryStorageClient()
    data = pattern_bytes("w.bin", 0, 40_000)
    mem.put("w.bin", data)
    named: list[str] = []

    def failing_publish(src, dst, **kwargs):
        named.append(os.fspath(dst))
        raise OSError(errno.EIO, "injected I/O error")

    storage = CountingStorageClient(mem)
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None
        if publish == "unnamed":
            assert unnamed.usable()
            monkeypatch.setattr(unnamed.os, "link", failing_publish)
        else:
            monkeypatch.setattr(unnamed, "_usable", False)
            monkeypatch.setattr(wholefile_entries.os, "rename", failing_publish)
        copy = await cache.open(version(mem, "w.bin"))
        reader = WholeFileReader(cache, copy)
        with trio.fail_after(5):
            await cache.writer.settled()
        assert not copy.writing
        assert named == [cache.path(version(mem, "w.bin"))]
        assert entries(tmp_path) == []
        assert temporaries(tmp_path) == []
        # the handle keeps reading the checked bytes it has
        assert bytes(await reader.read(0, 50_000)) == data
        reader.close()
        assert cache.statistics().space.reserved_bytes == 0
        # a later open downloads it again
        monkeypatch.undo()
        copy = await cache.open(version(mem, "w.bin"))
        assert await read_all(cache, copy) == data
        assert storage.statistics().range_requests == 2


async def test_many_small_files_are_all_written_and_unmount_waits_for_them(tmp_path):
    mem = InMemoryStorageClient()
    for i in range(200):
        mem.put(f"s/{i}", pattern_bytes(f"s/{i}", 0, 3000 + i))
    async with open_whole_file_cache(mem, config(tmp_path), LOC) as cache:
        assert cache is not None

        async def reader(names: list[int]) -> None:
            for i in names:
                copy = await cache.open(version(mem, f"s/{i}"))
                assert await read_all(cache, copy) == mem._data[f"s/{i}"]

        async with trio.open_nursery() as nursery:
            for k in range(8):
                nursery.start_soon(reader, list(range(k, 200, 8)))
        assert cache.statistics().open_copies == 0
    # unmount waited for the writes still queued
    assert len(entries(tmp_path)) == 200
    assert temporaries(tmp_path) == []
    for path in entries(tmp_path):
        assert path.stat().st_size in {3000 + i for i in range(200)}


async def test_a_file_up_to_one_part_is_one_get_written_before_the_open_returns(tmp_path):
    mem = InMemoryStorageClient()
    data = pattern_bytes("mid.bin", 0, 400_000)  # over the in-memory size, within a part
    mem.put("mid.bin", data)
    storage = CountingStorageClient(mem)
    cfg = dataclasses.replace(config(tmp_path), part_size=MiB)
    async with open_whole_file_cache(storage, cfg, LOC) as cache:
        assert cache is not None
        copy = await cache.open(version(mem, "mid.bin"))
        assert copy is not None
        assert copy.data is None
        assert copy.fd >= 0
        assert len(entries(tmp_path)) == 1
        assert await read_all(cache, copy) == data
    assert requests(storage) == (0, 0, 1)


async def test_a_big_file_costs_its_parts_and_no_properties_request(tmp_path):
    mem = InMemoryStorageClient()
    data = pattern_bytes("big.bin", 0, 2 * MiB + 5)
    mem.put("big.bin", data)
    storage = CountingStorageClient(mem)
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None
        copy = await cache.open(version(mem, "big.bin"))
        assert await read_all(cache, copy) == data
    assert requests(storage) == (0, 0, -(-len(data) // PART))


async def test_a_cold_open_does_not_look_on_disk_for_what_was_never_cached(tmp_path, monkeypatch):
    mem = InMemoryStorageClient()
    mem.put("kept.bin", pattern_bytes("kept.bin", 0, 5000))
    mem.put("new.bin", pattern_bytes("new.bin", 0, 6000))
    storage = CountingStorageClient(mem)
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None
        cache.release(await cache.open(version(mem, "kept.bin")))
    looked: list[str] = []
    real_open_entry = wholefile_entries.open_entry

    def open_entry(path):
        looked.append(os.path.basename(path))
        return real_open_entry(path)

    monkeypatch.setattr(wholefile_entries, "open_entry", open_entry)
    async with open_whole_file_cache(storage, config(tmp_path), LOC) as cache:
        assert cache is not None
        with trio.fail_after(5):
            while not cache._present.complete:  # the scan of the earlier mount's entries
                await trio.sleep(0.001)
        before = requests(storage)
        for name in ("kept.bin", "new.bin"):
            copy = await cache.open(version(mem, name))
            assert await read_all(cache, copy) == mem._data[name]
        with trio.fail_after(5):
            while cache._open:
                await trio.sleep(0.001)
        copy = await cache.open(version(mem, "new.bin"))
        assert await read_all(cache, copy) == mem._data["new.bin"]
        # kept.bin found on disk (no GET); new.bin fetched without looking, then found there
        kept, new = (Path(cache.path(version(mem, n))).name for n in ("kept.bin", "new.bin"))
        assert looked == [kept, new]
        assert requests(storage)[2] == before[2] + 1


@pytest.mark.parametrize("size", [0, 1, 2046, 2047, 2048, 4094, 25_000, 256 * 1024])
def test_the_hash_fed_in_pieces_is_md5(size):
    data = pattern_bytes("md5", 0, size)
    assert md5_keeping_gil(data) == hashlib.md5(data).digest()


# -- the entry writer's thread (EntryWriter) ------------------------------------------------------


async def test_entries_are_written_off_the_trio_thread_and_land_on_it(tmp_path):
    trio_thread = threading.get_ident()
    landed: list[tuple[EntryWrite, int]] = []
    writer = EntryWriter(lambda item: landed.append((item, threading.get_ident())))
    items = [EntryWrite(os.fspath(tmp_path / f"e{i}"), b"x" * i) for i in range(200)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        for item in items:
            writer.submit(item)
        assert writer.busy
        with trio.fail_after(10):
            await writer.settled()
        assert not writer.busy
        nursery.cancel_scope.cancel()
    assert [item for item, _ in landed] == items  # each once, in order
    assert {thread for _, thread in landed} == {trio_thread}
    assert all(item.outcome == "written" for item in items)
    assert all((tmp_path / f"e{i}").read_bytes() == b"x" * i for i in range(200))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"e{i}" for i in range(200))


async def test_small_entries_are_written_in_place_until_a_write_stalls(tmp_path, monkeypatch):
    trio_thread = threading.get_ident()
    writers: dict[str, int] = {}
    real_write = wholefile_entries.put_entry

    def timed_write(path, data):
        writers[os.path.basename(path)] = threading.get_ident()
        if path.endswith("stalls"):
            time.sleep(0.1)  # one write the disk takes its time over
        return real_write(path, data)

    monkeypatch.setattr(wholefile_entries, "put_entry", timed_write)
    writer = EntryWriter(lambda item: None, InlineReadGate(stall_s=0.05, first_backoff_s=60))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        for name in ("a", "b", "stalls", "after", "big"):
            size = 300 * 1024 if name == "big" else 10
            writer.submit(EntryWrite(os.fspath(tmp_path / name), b"x" * size))
            with trio.fail_after(10):
                await writer.settled()
        nursery.cancel_scope.cancel()
    # in place (no thread, no GIL handoffs) until one write stalled; then in the thread, as
    # is an entry too big to write in place at all
    here = {name for name, thread in writers.items() if thread == trio_thread}
    assert here == {"a", "b", "stalls"}
    assert set(writers) == {"a", "b", "stalls", "after", "big"}
    assert all((tmp_path / name).exists() for name in writers)


async def test_writes_in_place_wait_behind_a_fetch_until_the_loop_is_idle_or_a_while_at_most(
    tmp_path, mock_clock
):
    """A write in place does not take the trio thread from requests that can run, nor from the
    gap before a reader's next open: it waits until one of the cache's fetches is on the wire
    and every task is blocked, or `MAX_DEFER_S` of (here: mock) time."""
    landed: list[EntryWrite] = []
    writer = EntryWriter(landed.append, InlineReadGate())

    async def settle(until_landed: int) -> None:
        for _ in range(10):  # idle waiters are woken one at a time
            await trio.testing.wait_all_tasks_blocked()
            if len(landed) >= until_landed:
                return

    async def fetch(done: trio.Event) -> None:
        with writer.fetching():
            await done.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        await trio.testing.wait_all_tasks_blocked()
        writer.submit(EntryWrite(os.fspath(tmp_path / "first"), b"1"))
        await settle(1)
        assert landed == []  # idle, but no fetch to write behind
        first_fetch = trio.Event()
        nursery.start_soon(fetch, first_fetch)
        for _ in range(100):  # a busy loop: there is always a task that can run
            await trio.lowlevel.checkpoint()
        assert landed == []
        await settle(1)  # now idle with a fetch on the wire: written
        assert [item.outcome for item in landed] == ["written"]

        writer.submit(EntryWrite(os.fspath(tmp_path / "second"), b"2"))
        for _ in range(100):
            await trio.lowlevel.checkpoint()
        assert len(landed) == 1
        mock_clock.jump(writer_module.MAX_DEFER_S)  # busy for that long: written anyway
        for _ in range(100):
            await trio.lowlevel.checkpoint()
            if len(landed) == 2:
                break
        assert len(landed) == 2

        first_fetch.set()  # no fetch left
        await trio.testing.wait_all_tasks_blocked()
        writer.submit(EntryWrite(os.fspath(tmp_path / "third"), b"3"))
        await settle(3)
        assert len(landed) == 2
        mock_clock.jump(writer_module.MAX_DEFER_S)  # no fetch came for that long: written
        await settle(3)
        assert len(landed) == 3
        nursery.cancel_scope.cancel()
    assert [(tmp_path / name).read_bytes() for name in ("second", "third")] == [b"2", b"3"]


async def test_a_write_submitted_while_the_writer_stops_still_lands(tmp_path, monkeypatch):
    """An open that completes during unmount submits while the writer's task waits for the
    thread's last writes: that write goes to the thread too, and lands (in place, nobody would
    write it, and the wait would never end)."""
    real_write = wholefile_entries.put_entry

    def slow_big_write(path, data):
        if path.endswith("big"):
            time.sleep(0.3)  # keeps the thread, and so the writer's end, busy
        return real_write(path, data)

    monkeypatch.setattr(wholefile_entries, "put_entry", slow_big_write)
    landed: list[EntryWrite] = []
    writer = EntryWriter(landed.append, InlineReadGate())
    big = EntryWrite(os.fspath(tmp_path / "big"), b"x" * (300 * 1024))  # too big: the thread
    late = EntryWrite(os.fspath(tmp_path / "late"), b"late")

    async def submit_during_stop() -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(0.1)  # the writer's task is cancelled and waiting for `big`
            writer.submit(late)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            await trio.testing.wait_all_tasks_blocked()
            writer.submit(big)
            nursery.start_soon(submit_during_stop)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert landed == [big, late]
    assert (tmp_path / "late").read_bytes() == b"late"


async def test_unmount_writes_what_is_queued_and_a_failure_lands_too(tmp_path):
    landed: list[EntryWrite] = []
    writer = EntryWriter(landed.append)
    kept = EntryWrite(os.fspath(tmp_path / "kept"), b"two")
    failing = EntryWrite(os.fspath(tmp_path / "not-a-folder" / "x" / "entry"), b"three")
    (tmp_path / "not-a-folder").write_bytes(b"")  # its fan-out folder cannot be made
    cancelled = EntryWrite(os.fspath(tmp_path / "cancelled"), b"four", cancelled=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        await trio.testing.wait_all_tasks_blocked()
        for item in (kept, failing, cancelled):
            writer.submit(item)
        nursery.cancel_scope.cancel()  # unmount: what is queued is still written
    assert landed == [kept, failing, cancelled]
    assert (kept.outcome, failing.outcome, cancelled.outcome) == ("written", "failed", "skipped")
    assert isinstance(failing.error, OSError)
    assert (tmp_path / "kept").read_bytes() == b"two"
    assert not (tmp_path / "cancelled").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "not-a-folder"]


async def test_opens_waiting_for_a_transfer_slot_get_the_writes_done_at_once(tmp_path, mock_clock):
    """Every transfer slot held by a small file whose entry waits to be written behind a fetch,
    and more opens waiting for a slot: those opens are the fetch, so the writes land and the
    opens go on with no time passing (they waited `MAX_DEFER_S` for each slot's worth before:
    150 files/s with 8 readers of a source that answers at once)."""
    mem = InMemoryStorageClient()
    names = [f"s/{i}" for i in range(6)]
    for name in names:
        mem.put(name, pattern_bytes(name, 0, 5000))
    slots = dataclasses.replace(config(tmp_path), download_slots=2)
    opened: list[str] = []
    async with open_whole_file_cache(mem, slots, LOC) as cache:
        assert cache is not None

        async def open_one(name: str) -> None:
            copy = await cache.open(version(mem, name))
            assert await read_all(cache, copy) == mem._data[name]
            opened.append(name)

        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(open_one, name)
            for _ in range(400):  # up to 2 s of real time for the disk work in threads
                await trio.testing.wait_all_tasks_blocked()
                if len(opened) == len(names):
                    break
                time.sleep(0.005)  # real time, for the threads: the mock clock stays still
            opened_in_no_time = sorted(opened)
            assert trio.current_time() == 0
            # time moves on whenever all wait from here: a stalled writer ends, and a failure
            # of this test does not hang
            mock_clock.autojump_threshold = 0
        assert opened_in_no_time == names
    assert len(entries(tmp_path)) == len(names)
