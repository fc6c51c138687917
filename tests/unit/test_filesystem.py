"""BlobFilesystem without FUSE: namespace, lazy listing, lookups, open/read, refusals."""

import errno
import os
import stat

import pytest
import trio
import trio.testing

from blobmount.blocks.manager import BlockManager, BlockManagerConfig
from blobmount.errors import BlobChanged
from blobmount.fs.errno_map import FsError, errno_for
from blobmount.fs.filesystem import BlobFilesystem, FsConfig
from blobmount.namespace.inodes import ROOT_INODE
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.memory import InMemoryStorageClient
from tests.helpers.readdir import read_entries

B = 64 * 1024


def make_fs(nursery, mem, *, prefix="", ttl_s=None):
    storage = CountingStorageClient(mem)
    blocks = BlockManager(storage, BlockManagerConfig(B, 4, 4, 4 * B, 16 * B), nursery)
    cfg = FsConfig(prefix, ttl_s, 1000, 1000, 0o444, 0o555, 1.7e9, B)
    return BlobFilesystem(storage, blocks, cfg), storage


def store():
    mem = InMemoryStorageClient()
    mem.put("top.txt", b"top")
    mem.put("a/b/c.bin", b"c" * 1000)
    mem.put("a/file with space.txt", b"spaces")
    mem.put("a/ünïcødé.txt", b"unicode")
    mem.put("marker", b"", dir_marker=True)
    mem.put("a//bad", b"x")  # empty segment: not a POSIX path
    mem.put("a/../escape", b"x")
    return mem


async def listdir(fs, inode):
    fh = await fs.opendir(inode)
    out = await read_entries(fs, fh)
    fs.releasedir(fh)
    return dict(out)


async def test_listing_maps_prefixes_and_markers_to_folders(nursery, caplog):
    fs, _ = make_fs(nursery, store())
    root = await listdir(fs, ROOT_INODE)
    assert set(root) == {"top.txt", "a", "marker"}
    assert stat.S_ISDIR(root["a"].mode)
    assert stat.S_ISDIR(root["marker"].mode)
    assert stat.S_ISREG(root["top.txt"].mode)
    assert root["top.txt"].size == 3
    assert root["top.txt"].mode & 0o777 == 0o444
    a = await fs.lookup(ROOT_INODE, "a")
    entries = await listdir(fs, a.inode)
    # invalid names ("a//bad", "a/../escape") are left out
    assert set(entries) == {"b", "file with space.txt", "ünïcødé.txt"}


async def test_prefix_mount_sees_only_below_prefix(nursery):
    fs, _ = make_fs(nursery, store(), prefix="a/")
    root = await listdir(fs, ROOT_INODE)
    assert set(root) == {"b", "file with space.txt", "ünïcødé.txt"}
    node = await fs.lookup(ROOT_INODE, "b")
    c = await fs.lookup(node.inode, "c.bin")
    opened = await fs.open(c.inode, os.O_RDONLY)
    assert await fs.read(opened.fh, 0, 4096) == b"c" * 1000


async def test_readdir_is_lazy(nursery):
    mem = InMemoryStorageClient()
    for i in range(12000):
        mem.put(f"big/f{i:05d}", b"")
    fs, storage = make_fs(nursery, mem)
    big = await fs.lookup(ROOT_INODE, "big")
    fh = await fs.opendir(big.inode)
    seen = []

    def reply(name, attr, nxt):
        seen.append(name)
        return len(seen) < 10  # the kernel's buffer is full after 10 entries

    list_before = storage.list_requests
    await fs.readdir(fh, 0, reply)
    assert len(seen) == 10
    assert storage.list_requests - list_before == 1  # one page, not the whole folder
    # continue from the offset the kernel got: stable indices, nothing lost or repeated
    rest = [name for name, _ in await read_entries(fs, fh, 9)]
    assert len(seen[:9]) + len(rest) == 12000
    assert len(set(seen[:9] + rest)) == 12000
    assert storage.list_requests - list_before == 3


async def test_lookup_costs_and_negative_cache(nursery):
    fs, storage = make_fs(nursery, store())
    node = await fs.lookup(ROOT_INODE, "top.txt")
    assert node is not None
    assert storage.properties_requests == 1
    assert storage.list_requests == 0
    # a folder without marker: one properties request, then one one-item prefix probe
    assert (await fs.lookup(ROOT_INODE, "a")).is_dir
    assert (storage.properties_requests, storage.list_requests) == (2, 1)
    # the third lookup in a folder nobody listed lists it once (one page) instead
    assert await fs.lookup(ROOT_INODE, "missing") is None
    assert (storage.properties_requests, storage.list_requests) == (2, 2)
    assert await fs.lookup(ROOT_INODE, "missing") is None  # answered by the listing
    assert await fs.lookup(ROOT_INODE, "marker") is not None
    assert (storage.properties_requests, storage.list_requests) == (2, 2)


async def test_negative_lookups_are_cached_without_a_listing(nursery):
    mem = InMemoryStorageClient()
    for i in range(6000):  # more than one page: a miss past page one asks storage
        mem.put(f"big/f{i:05d}", b"")
    fs, storage = make_fs(nursery, mem)
    big = await fs.lookup(ROOT_INODE, "big")
    for name in ("f00001", "f00002", "f05999"):
        assert await fs.lookup(big.inode, name) is not None
    before = storage.statistics().requests
    assert await fs.lookup(big.inode, "zzz") is None
    after_miss = storage.statistics().requests
    assert after_miss > before
    assert await fs.lookup(big.inode, "zzz") is None  # the negative answer is cached
    assert storage.statistics().requests == after_miss


async def test_many_lookups_in_an_unlisted_folder_cost_a_page_not_a_head_each(nursery):
    mem = InMemoryStorageClient()
    for i in range(1000):
        mem.put(f"imgs/{i:04d}.jpg", b"x")
    fs, storage = make_fs(nursery, mem)
    imgs = await fs.lookup(ROOT_INODE, "imgs")
    before = (storage.properties_requests, storage.list_requests)
    for i in range(1000):
        assert await fs.lookup(imgs.inode, f"{i:04d}.jpg") is not None
    heads = storage.properties_requests - before[0]
    lists = storage.list_requests - before[1]
    assert heads <= 2  # the first lookups, before the pattern shows
    assert lists == 1


async def test_lookup_after_listing_costs_nothing(nursery):
    fs, storage = make_fs(nursery, store())
    await listdir(fs, ROOT_INODE)
    before = storage.statistics().requests
    assert await fs.lookup(ROOT_INODE, "top.txt") is not None
    assert await fs.lookup(ROOT_INODE, "nope") is None
    assert storage.statistics().requests == before


async def test_names_the_kernel_sends_that_no_blob_can_have(nursery):
    fs, storage = make_fs(nursery, store())
    # bytes that are not UTF-8 arrive surrogate-escaped: absent, and storage is not asked
    for raw in (b"\xff", b"caf\xe9.txt", b"\xed\xa0\x80"):
        assert await fs.lookup(ROOT_INODE, raw.decode("utf-8", "surrogateescape")) is None
    assert storage.statistics().requests == 0
    # a name longer than NAME_MAX bytes is ENAMETOOLONG, as statfs's name_max promises
    assert await fs.lookup(ROOT_INODE, "é" * 127 + "x") is None  # 255 bytes: just absent
    with pytest.raises(FsError) as info:
        await fs.lookup(ROOT_INODE, "é" * 128)  # 256 bytes
    assert info.value.errno == errno.ENAMETOOLONG
    assert fs.statfs().name_max == 255


async def test_inodes_are_stable(nursery):
    fs, _ = make_fs(nursery, store())
    first = (await fs.lookup(ROOT_INODE, "top.txt")).inode
    await listdir(fs, ROOT_INODE)
    fs.forget([(first, 2)])
    assert (await fs.lookup(ROOT_INODE, "top.txt")).inode == first


@pytest.mark.parametrize(
    "flags", [os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_WRONLY | os.O_APPEND]
)
async def test_open_for_writing_is_refused(nursery, flags):
    fs, _ = make_fs(nursery, store())
    node = await fs.lookup(ROOT_INODE, "top.txt")
    with pytest.raises(FsError) as info:
        await fs.open(node.inode, flags)
    assert info.value.errno == errno.EROFS


async def test_open_a_folder_is_eisdir(nursery):
    fs, _ = make_fs(nursery, store())
    node = await fs.lookup(ROOT_INODE, "a")
    with pytest.raises(FsError) as info:
        await fs.open(node.inode, os.O_RDONLY)
    assert info.value.errno == errno.EISDIR


async def test_handle_is_pinned_to_its_version(nursery):
    mem = store()
    mem.put("big", b"1" * (10 * B))
    fs, _ = make_fs(nursery, mem)
    node = await fs.lookup(ROOT_INODE, "big")
    opened = await fs.open(node.inode, os.O_RDONLY)
    assert opened.keep_cache
    assert await fs.read(opened.fh, 0, 10) == b"1" * 10
    await trio.testing.wait_all_tasks_blocked()  # read-ahead of blocks 1-2 has landed
    mem.put("big", b"2" * (10 * B))
    # blocks already held are of the pinned version: still consistent
    assert await fs.read(opened.fh, B, 10) == b"1" * 10
    # anything that needs storage now fails rather than mixing versions
    with pytest.raises(BlobChanged) as info:
        await fs.read(opened.fh, 8 * B, 10)
    assert errno_for(info.value)[0] == errno.EIO


async def test_ttl_expiry_shows_new_version_and_drops_kernel_cache(nursery, autojump_clock):
    mem = store()
    fs, _ = make_fs(nursery, mem, ttl_s=1.0)
    node = await fs.lookup(ROOT_INODE, "top.txt")
    first = await fs.open(node.inode, os.O_RDONLY)
    fs.release(first.fh)
    mem.put("top.txt", b"new top!")
    await trio.sleep(2)
    assert (await fs.getattr(node.inode)).size == 8
    second = await fs.open(node.inode, os.O_RDONLY)
    assert not second.keep_cache  # the kernel must drop pages of the old version
    assert await fs.read(second.fh, 0, 100) == b"new top!"


async def test_two_versions_open_at_once_never_share_the_kernel_page_cache(nursery, autojump_clock):
    mem = store()
    fs, _ = make_fs(nursery, mem, ttl_s=1.0)
    node = await fs.lookup(ROOT_INODE, "top.txt")
    old = await fs.open(node.inode, os.O_RDONLY)
    assert (old.keep_cache, old.direct_io) == (True, False)
    assert await fs.read(old.fh, 0, 100) == b"top"
    mem.put("top.txt", b"new top!")
    await trio.sleep(2)
    # the old version is still open: the new one bypasses the (per-inode) page cache
    new = await fs.open(node.inode, os.O_RDONLY)
    assert (new.keep_cache, new.direct_io) == (False, True)
    assert await fs.read(new.fh, 0, 100) == b"new top!"
    assert await fs.read(old.fh, 0, 100) == b"top"  # still its own version (held in RAM)
    fs.release(old.fh)
    # only the new version is open now; the cache may still hold old pages, so drop them
    again = await fs.open(node.inode, os.O_RDONLY)
    assert (again.keep_cache, again.direct_io) == (False, False)
    fs.release(new.fh)
    fs.release(again.fh)
    last = await fs.open(node.inode, os.O_RDONLY)
    assert (last.keep_cache, last.direct_io) == (True, False)


async def test_a_first_open_of_a_small_file_starts_its_get_and_a_reopen_does_not(nursery):
    # the kernel holds no page of an inode opened for the first time, so its READ will come:
    # the GET goes out with the open. Once opened, the kernel may serve reads from its page
    # cache (keep_cache), and a GET at the open could be for nothing.
    mem = store()
    storage = CountingStorageClient(mem)
    blocks = BlockManager(storage, BlockManagerConfig(B, 4, 4, 0, 16 * B), nursery)
    fs = BlobFilesystem(storage, blocks, FsConfig("", None, 1000, 1000, 0o444, 0o555, 1.7e9, B))
    node = await fs.lookup(ROOT_INODE, "top.txt")
    first = await fs.open(node.inode, os.O_RDONLY)
    await trio.testing.wait_all_tasks_blocked()
    assert storage.range_requests == 1  # before any read
    assert await fs.read(first.fh, 0, 4096) == b"top"
    assert storage.range_requests == 1
    fs.release(first.fh)
    again = await fs.open(node.inode, os.O_RDONLY)
    await trio.testing.wait_all_tasks_blocked()
    assert storage.range_requests == 1
    assert await fs.read(again.fh, 0, 4096) == b"top"  # the kernel's pages were dropped
    assert storage.range_requests == 2
    fs.release(again.fh)
    assert blocks.statistics().read_ahead_bytes == 0


async def test_new_blob_appears_after_ttl(nursery, autojump_clock):
    mem = store()
    fs, _ = make_fs(nursery, mem, ttl_s=1.0)
    assert "late.txt" not in await listdir(fs, ROOT_INODE)
    mem.put("late.txt", b"late")
    assert await fs.lookup(ROOT_INODE, "late.txt") is None
    await trio.sleep(2)
    assert "late.txt" in await listdir(fs, ROOT_INODE)


async def test_without_ttl_the_view_is_fixed(nursery, autojump_clock):
    mem = store()
    fs, _ = make_fs(nursery, mem, ttl_s=None)
    await listdir(fs, ROOT_INODE)
    mem.put("late.txt", b"late")
    await trio.sleep(10_000)
    assert "late.txt" not in await listdir(fs, ROOT_INODE)
