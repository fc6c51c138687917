"""Tree walks without a request storm: hierarchical, flat and auto listing; inode lifetimes."""

from __future__ import annotations

import math

import pytest

from blobmount.blocks.manager import BlockManager, BlockManagerConfig
from blobmount.fs.filesystem import BlobFilesystem, FsConfig
from blobmount.namespace.inodes import ROOT_INODE, inode_for
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.memory import InMemoryStorageClient
from tests.helpers.readdir import read_entries

B = 64 * 1024
FOLDERS, PER_FOLDER = 5_000, 10  # the tree: 50,000 blobs in 5,000 folders


def tree() -> InMemoryStorageClient:
    mem = InMemoryStorageClient()
    for d in range(FOLDERS):
        for f in range(PER_FOLDER):
            mem.put(f"data/d{d:04d}/sub/f{f:02d}.jpg", b"x")
    mem.put("data/top.txt", b"t")
    mem.put("data/marker", b"", dir_marker=True)
    mem.put("data/d0001//bad", b"x")
    return mem


def make_fs(nursery, mem, mode, ttl_s=None, prefix=""):
    storage = CountingStorageClient(mem)
    blocks = BlockManager(storage, BlockManagerConfig(B, 4, 4, 0, 16 * B), nursery)
    cfg = FsConfig(prefix, ttl_s, 0, 0, 0o444, 0o555, 1.7e9, B, listing_mode=mode)
    return BlobFilesystem(storage, blocks, cfg), storage


async def walk(fs, inode=ROOT_INODE, path=""):
    """os.walk through the filesystem API: returns every file path."""
    fh = await fs.opendir(inode)
    entries = await read_entries(fs, fh)
    fs.releasedir(fh)
    files = []
    for name, attr in entries:
        child = f"{path}/{name}" if path else name
        if attr.mode & 0o040000:
            files += await walk(fs, attr.inode, child)
        else:
            files.append(child)
    return files


def expected_files():
    names = {f"data/d{d:04d}/sub/f{f:02d}.jpg" for d in range(FOLDERS) for f in range(PER_FOLDER)}
    return names | {"data/top.txt"}


@pytest.fixture(scope="module")
def big_tree() -> InMemoryStorageClient:
    return tree()


async def test_hierarchical_walk_costs_a_request_per_folder(nursery, big_tree):
    fs, storage = make_fs(nursery, big_tree, "hierarchical")
    assert set(await walk(fs)) == expected_files()
    assert storage.list_requests >= 2 * FOLDERS


@pytest.mark.parametrize("mode", ["flat", "auto"])
async def test_flat_and_auto_walks_cost_a_few_pages(nursery, mode, big_tree):
    fs, storage = make_fs(nursery, big_tree, mode)
    assert set(await walk(fs)) == expected_files()
    total = FOLDERS * PER_FOLDER + 3
    flat_pages = math.ceil(total / 5000)
    if mode == "flat":
        assert storage.list_requests == flat_pages
    else:
        # before the walk shows itself: the root, data/ (its own pages), and two subfolders
        # with their subfolders
        data_pages = math.ceil((FOLDERS + 2) / 5000)
        assert storage.list_requests == flat_pages + 1 + data_pages + 4
    stats = fs.statistics().catalog
    assert stats.walks == 1
    assert stats.walk_pages >= 1


async def test_flat_walk_streams_first_entries_before_the_end(nursery):
    mem = InMemoryStorageClient()
    for i in range(100_000):
        mem.put(f"flat/f{i:06d}", b"")
    fs, storage = make_fs(nursery, mem, "flat")
    flat = await fs.lookup(ROOT_INODE, "flat")
    before = storage.list_requests
    fh = await fs.opendir(flat.inode)
    seen = []
    await fs.readdir(fh, 0, lambda n, a, x: seen.append(n) or len(seen) < 10)
    assert storage.list_requests - before == 1  # first entries after one page
    rest = [name for name, _ in await read_entries(fs, fh, 9)]
    assert len(set(seen[:9] + rest)) == 100_000
    assert storage.list_requests - before == 20


async def test_walked_folder_listing_matches_paged(nursery, big_tree):
    mem = big_tree

    async def kinds(fs):
        data = await fs.lookup(ROOT_INODE, "data")
        fh = await fs.opendir(data.inode)
        return sorted((name, attr.mode >> 12) for name, attr in await read_entries(fs, fh))

    flat = await kinds(make_fs(nursery, mem, "flat")[0])
    assert flat == await kinds(make_fs(nursery, mem, "hierarchical")[0])
    assert ("marker", 0o040000 >> 12) in flat  # the marker blob is a folder


async def test_inode_numbers_survive_forget(nursery, big_tree):
    fs, _ = make_fs(nursery, big_tree, "auto")
    data = await fs.lookup(ROOT_INODE, "data")
    top = await fs.lookup(data.inode, "top.txt")
    number = top.inode
    assert number == inode_for("data/top.txt")
    fs.forget([(number, 1)])
    assert fs.inodes.get(number) is None  # memory for it is gone
    again = await fs.lookup(data.inode, "top.txt")
    assert again.inode == number
