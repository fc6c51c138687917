"""Nodes and the inode table: packed attributes, lifetimes (forget, listing expiry), readers of
expired listings, and hash collisions of inode numbers."""

from __future__ import annotations

import pytest
import trio

from blobmount.namespace import inodes
from blobmount.namespace.inodes import ROOT_INODE, InodeTable, Node, inode_for
from blobmount.namespace.listing import DirEntry
from blobmount.storage.memory import InMemoryStorageClient
from tests.helpers.readdir import read_entries
from tests.unit.test_listing_modes import make_fs


@pytest.mark.parametrize(
    "etag",
    [
        '"0x8DBEB8E3A4C7D2F"',  # Azure: 15 hex digits, quoted
        '"0x0000000000000001"',  # leading zeros kept
        '"0xFFFFFFFFFFFFFFFF"',
        '"0x8dbeb8e3a4c7d2f"',  # lower case: not the packed shape, kept as text
        '"0x8DBEB8E3A4C7D2F00"',  # too long for 8 bytes
        "0x8DBEB8E3A4C7D2F",  # unquoted
        'W/"0x8DBEB8E3A4C7D2F"',
        '"abc"',
        "",
        None,
    ],
)
@pytest.mark.parametrize("name", ["img_0000001.jpg", "ünïcødé ☃.txt", "x" * 255, "a\udcff"])
def test_a_node_gives_back_what_it_was_given(etag, name):
    node = Node(7, "some/folder", name, False, 123_456_789_012, 1.7e9 + 0.25, etag, 5.0)
    assert (node.name, node.etag, node.size, node.mtime) == (
        name,
        etag,
        123_456_789_012,
        1.7e9 + 0.25,
    )
    assert (node.is_dir, node.listed, node.path) == (False, False, f"some/folder/{name}")
    node.listed = True
    node.set(True, 0, 0.0, None, 6.0)
    assert (node.name, node.is_dir, node.listed, node.etag, node.fetched) == (
        name,
        True,
        True,
        None,
        6.0,
    )


def test_open_state_exists_only_for_opened_files():
    node = Node(7, "", "f", False, 1, 1.0, '"0x1"', 0.0)
    assert (node.opens, node.open_etag, node.extra) == (0, None, None)
    node.opens += 1
    node.open_etag = '"0x1"'
    assert (node.opens, node.open_etag) == (1, '"0x1"')


def test_inode_numbers_are_path_hashes_of_60_bits():
    table = InodeTable(0.0)
    node = table.upsert(table.root, DirEntry("a", True, 0, 0.0, None), 0.0)
    assert node.inode == inode_for("a") < 2**60
    child = table.upsert(node, DirEntry("b", False, 1, 0.0, '"0x1"'), 0.0)
    assert child.inode == inode_for("a/b")
    assert table.child(node, "b") is child
    assert table.get(child.inode) is child


def folder(count: int) -> InMemoryStorageClient:
    mem = InMemoryStorageClient()
    for i in range(count):
        mem.put(f"many/f{i:05d}", b"")
    return mem


async def list_all(fs, name="many"):
    node = await fs.lookup(ROOT_INODE, name)
    fh = await fs.opendir(node.inode)
    entries = await read_entries(fs, fh)
    fs.releasedir(fh)
    return node, {name: attr.inode for name, attr in entries}


async def test_a_listed_node_outlives_forget_until_its_listing_expires(nursery, autojump_clock):
    mem = folder(20)
    fs, _ = make_fs(nursery, mem, "hierarchical", ttl_s=10.0)
    many, numbers = await list_all(fs)
    fs.forget([(n, 1) for n in numbers.values()])  # readdirplus counted one lookup each
    assert all(fs.inodes.get(n) is not None for n in numbers.values())  # the listing holds them
    mem.delete("many/f00003")
    await trio.sleep(11)
    _, again = await list_all(fs)  # a new listing: the old one releases its nodes
    assert again == {k: v for k, v in numbers.items() if k != "f00003"}  # same numbers
    assert fs.inodes.get(numbers["f00003"]) is None  # gone from storage and forgotten: freed


async def test_expired_listings_nobody_reads_give_their_memory_back(nursery, autojump_clock):
    mem = folder(50)
    mem.put("other/x", b"")
    fs, _ = make_fs(nursery, mem, "hierarchical", ttl_s=10.0)
    _, numbers = await list_all(fs)
    fs.forget([(n, 1) for n in numbers.values()])
    assert len(fs.inodes) == 52  # the root, many/ and its 50 files
    await trio.sleep(11)
    await list_all(fs, "other")  # any new listing sweeps the expired ones
    assert len(fs.inodes) == 4  # the root, many/ (looked up), other/ and other/x
    assert all(fs.inodes.get(n) is None for n in numbers.values())


async def test_a_kernel_known_node_survives_its_listing(nursery, autojump_clock):
    mem = folder(3)
    mem.put("other/x", b"")
    fs, _ = make_fs(nursery, mem, "hierarchical", ttl_s=10.0)
    many, numbers = await list_all(fs)
    node = fs.inodes.get(numbers["f00001"])
    await trio.sleep(11)
    await list_all(fs, "other")  # sweeps the expired listing of many/
    assert fs.inodes.get(numbers["f00001"]) is node  # the kernel still holds it
    assert (await fs.getattr(node.inode)).size == 0


@pytest.mark.parametrize("mode", ["hierarchical", "flat"])
async def test_a_reader_of_an_expired_listing_gets_every_entry(nursery, autojump_clock, mode):
    # three list pages; in flat mode the walk goes on filling the listings it made
    mem = folder(12_000)
    fs, _ = make_fs(nursery, mem, mode, ttl_s=10.0)
    many = await fs.lookup(ROOT_INODE, "many")
    old = await fs.opendir(many.inode)
    first = []
    await fs.readdir(old, 0, lambda n, a, x: first.append((n, a.inode)) or len(first) < 100)
    await trio.sleep(11)
    new = await fs.opendir(many.inode)  # the old listing expired: a new one replaces it
    newer = dict(await read_entries(fs, new))
    rest = await read_entries(fs, old, 99)
    names = [n for n, _ in first[:99]] + [n for n, _ in rest]
    assert sorted(names) == [f"f{i:05d}" for i in range(12_000)]
    assert all(newer[n].inode == a.inode for n, a in rest)  # one number per path, always
    assert dict(first[:99]) == {n: newer[n].inode for n, _ in first[:99]}


async def test_colliding_inode_numbers_stay_distinct(nursery, monkeypatch):
    monkeypatch.setattr(inodes, "inode_for", lambda path: 100 + len(path) % 3)
    mem = folder(30)
    fs, _ = make_fs(nursery, mem, "hierarchical")
    many, numbers = await list_all(fs)
    assert len(set(numbers.values())) == 30
    for name, number in numbers.items():
        node = await fs.lookup(many.inode, name)
        assert (node.inode, node.name) == (number, name)
        assert fs.inodes.get(number) is node
    assert await fs.lookup(many.inode, "f99999") is None
