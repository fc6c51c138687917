"""Two BlobFilesystems sharing one SharedNamespace, as two processes of a mount do: any request
may land in either, and a handle read in the other never mixes blob versions."""

import errno
import os

import pytest
import trio

from blobmount.blocks.manager import BlockManager, BlockManagerConfig
from blobmount.errors import BlobChanged
from blobmount.fs.errno_map import FsError
from blobmount.fs.filesystem import BlobFilesystem, FsConfig
from blobmount.multiproc.namespace import SharedNamespace
from blobmount.namespace.inodes import ROOT_INODE
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.memory import InMemoryStorageClient
from tests.helpers.readdir import read_entries

B = 64 * 1024


@pytest.fixture
def shared(tmp_path):
    namespace = SharedNamespace.create(tmp_path, 2)
    yield namespace
    namespace.close()


def make_fs(nursery, mem, shared):
    blocks = BlockManager(mem, BlockManagerConfig(B, 4, 4, 4 * B, 16 * B), nursery)
    cfg = FsConfig("", None, 1000, 1000, 0o444, 0o555, 1.7e9, B)
    return BlobFilesystem(mem, blocks, cfg, shared=shared)


def store():
    mem = InMemoryStorageClient()
    mem.put("a/b/c.bin", b"c" * 1000)
    mem.put("a/d.bin", b"d" * 10)
    return mem


def counted_pair(nursery, mem, shared):
    """Two filesystems on `shared`, each with its own counted client of `mem`, no RAM tier."""
    counted = [CountingStorageClient(mem), CountingStorageClient(mem)]
    pair = tuple(
        BlobFilesystem(
            storage,
            BlockManager(storage, BlockManagerConfig(B, 4, 4, 0, 16 * B), nursery),
            FsConfig("", None, 1000, 1000, 0o444, 0o555, 1.7e9, B),
            shared=shared,
        )
        for storage in counted
    )
    return counted, pair


async def d_bin_in_one(nursery, mem, shared):
    """Two filesystems on `shared`, and the inode of a/d.bin as the first looked it up."""
    one, two = make_fs(nursery, mem, shared), make_fs(nursery, mem, shared)
    a = await one.lookup(ROOT_INODE, "a")
    d = await one.lookup(a.inode, "d.bin")
    return one, two, d.inode


async def test_an_inode_handed_out_by_one_is_resolved_by_the_other(nursery, shared):
    mem = store()
    one, two = make_fs(nursery, mem, shared), make_fs(nursery, mem, shared)
    a = await one.lookup(ROOT_INODE, "a")
    b = await one.lookup(a.inode, "b")
    c = await one.lookup(b.inode, "c.bin")
    attr = await two.getattr(c.inode)  # two never looked it up
    assert (attr.inode, attr.size) == (c.inode, 1000)
    assert (await two.lookup(b.inode, "c.bin")).inode == c.inode
    with pytest.raises(FsError) as info:
        await two.getattr(c.inode + 1)  # nobody handed that one out
    assert info.value.errno == errno.ENOENT


async def test_a_handle_is_read_and_released_in_the_other(nursery, shared):
    one, two, d_inode = await d_bin_in_one(nursery, store(), shared)
    opened = await one.open(d_inode, 0)
    assert await two.read(opened.fh, 0, 100) == b"d" * 10
    two.release(opened.fh)
    with pytest.raises(FsError) as info:
        await two.read(opened.fh, 0, 100)
    assert info.value.errno == errno.EBADF
    # the opener drops its own copy of the handle released elsewhere (a sweep, a few times a
    # second, at its next release)
    assert one.open_files == 1
    one._last_sweep = -1e9
    other = await one.open(d_inode, 0)
    one.release(other.fh)
    assert one.open_files == 0


async def test_a_handle_read_in_the_other_keeps_its_version(nursery, shared):
    mem = store()
    one, two, d_inode = await d_bin_in_one(nursery, mem, shared)
    old = await one.open(d_inode, 0)
    mem.put("a/d.bin", b"new" * 5)  # the blob changes while the handle is open
    # two is pinned to the handle's version: the store no longer has it, so EIO, never new bytes
    with pytest.raises(BlobChanged):
        await two.read(old.fh, 0, 100)
    # a new open sees the new version, in either, and bypasses the page cache while the old
    # version is open in the other process
    await two._refresh(two.inodes.get(d_inode))  # (attributes never expire here)
    new = await two.open(d_inode, 0)
    assert new.direct_io
    assert not new.keep_cache
    assert await one.read(new.fh, 0, 100) == b"new" * 5
    one.release(old.fh)
    two.release(new.fh)


async def test_a_folder_handle_is_read_in_the_other(nursery, shared):
    mem = store()
    one, two = make_fs(nursery, mem, shared), make_fs(nursery, mem, shared)
    a = await one.lookup(ROOT_INODE, "a")
    fh = await one.opendir(a.inode)
    entries = dict(await read_entries(two, fh))
    assert sorted(entries) == ["b", "d.bin"]
    # the entries two handed out (readdirplus) resolve in one
    assert (await one.getattr(entries["d.bin"].inode)).size == 10
    two.releasedir(fh)
    with pytest.raises(FsError):
        await one.readdir(fh + (1 << 40), 0, lambda *args: True)


async def test_a_large_files_handle_is_read_by_its_opener(nursery, shared, tmp_path):
    """A file of several blocks read through the other filesystem is read by the opener (one
    read-ahead, one fetch per block); a one-block file is read where the READ lands; with the
    opener gone the other reads the pinned version itself."""
    from blobmount.fs.forward import ReadForwarder, ReadServer
    from blobmount.testing.pattern import pattern_bytes

    mem = store()
    big = pattern_bytes("big", 0, 5 * B + 17)
    mem.put("a/big.bin", big)
    counted, (one, two) = counted_pair(nursery, mem, shared)
    with trio.CancelScope() as opener_scope:
        async with trio.open_nursery() as opener_side:
            await opener_side.start(ReadServer(tmp_path, 0, one.read).run)
            two.forwarder = ReadForwarder(tmp_path, 1, nursery)
            a = await one.lookup(ROOT_INODE, "a")
            big_inode = (await one.lookup(a.inode, "big.bin")).inode
            d_inode = (await one.lookup(a.inode, "d.bin")).inode
            opened = await one.open(big_inode, 0)
            out = bytearray()
            while chunk := await (one, two)[len(out) // B % 2].read(opened.fh, len(out), B):
                out += chunk  # the READs alternate between the two, as the kernel spreads them
            assert out == big
            assert counted[1].range_requests == 0  # every block came through the opener
            assert two.forwarder.forwarded == 4  # blocks 1, 3 and 5, and the read at the end
            small = await one.open(d_inode, 0)
            assert bytes(await two.read(small.fh, 0, 100)) == b"d" * 10
            assert counted[1].range_requests == 1  # a one-block file: read where it landed
            opener_scope.cancel()  # the opener goes away
    assert bytes(await two.read(opened.fh, 2 * B, 10)) == big[2 * B : 2 * B + 10]
    assert counted[1].range_requests == 2
    assert two.forwarder.failed == 1


async def test_an_open_of_a_hinted_file_is_made_by_the_main_process(nursery, shared, tmp_path):
    """The main process (index 0) has hints for a/d.bin: an open of it in another process is
    made by the main process, whose handle every READ then goes to (there are its hinted
    blocks); other files are opened where the OPEN lands. (In one process both filesystems
    allocate handle numbers from one range: who opened a handle shows in `open_files`.)"""
    from blobmount.fs.forward import ReadForwarder, ReadServer

    mem = store()
    counted, (main, other) = counted_pair(nursery, mem, shared)
    with trio.CancelScope() as main_scope:
        async with trio.open_nursery() as main_side:
            await main_side.start(
                ReadServer(tmp_path, 0, main.read, None, main.open_for_another).run
            )
            main.forwarder = ReadForwarder(tmp_path, 0, nursery)
            other.forwarder = ReadForwarder(tmp_path, 1, nursery)
            a = await other.lookup(ROOT_INODE, "a")
            d_inode = (await other.lookup(a.inode, "d.bin")).inode
            c_inode = (await other.lookup((await other.lookup(a.inode, "b")).inode, "c.bin")).inode
            shared.hinted.add("a/d.bin")  # as the main process's hint coordinator does

            opened = await other.open(d_inode, os.O_RDONLY)
            assert other.forwarder.opens == 1
            record = shared.handles.get(opened.fh)
            assert record is not None
            assert record.by_owner
            assert (main.open_files, other.open_files) == (1, 0)
            # a one-block file, yet its READ in the other process is read by the main one
            assert bytes(await other.read(opened.fh, 0, 100)) == b"d" * 10
            assert bytes(await main.read(opened.fh, 0, 100)) == b"d" * 10
            assert counted[1].range_requests == 0
            assert other.forwarder.forwarded == 1
            other.release(opened.fh)

            # the main process's own open of a hinted file: its READs come back to it too
            own = await main.open(d_inode, os.O_RDONLY)
            own_record = shared.handles.get(own.fh)
            assert own_record is not None
            assert own_record.by_owner
            main.release(own.fh)

            # a file without hints is opened where the OPEN lands
            plain = await other.open(c_inode, os.O_RDONLY)
            assert (main.open_files, other.open_files) == (0, 1)
            assert other.forwarder.opens == 1
            other.release(plain.fh)

            # with the main process gone, the open is made here
            main_scope.cancel()
    alone = await other.open(d_inode, os.O_RDONLY)
    assert other.open_files == 1
    assert bytes(await other.read(alone.fh, 0, 100)) == b"d" * 10
    assert other.forwarder.failed == 1


async def test_an_interrupted_open_passed_to_the_main_process_leaves_no_handle(
    nursery, shared, tmp_path
):
    """The job's open is interrupted while the main process opens the file for it: the handle
    the main process made is released, not left open for ever."""
    from blobmount.fs.forward import ReadForwarder, ReadServer

    mem = store()
    _, (main, other) = counted_pair(nursery, mem, shared)

    async def slow_open(inode: int, flags: int) -> tuple[int, bool, bool]:
        await trio.sleep(0.05)
        return await main.open_for_another(inode, flags)

    with trio.CancelScope() as main_scope:
        async with trio.open_nursery() as main_side:
            await main_side.start(ReadServer(tmp_path, 0, main.read, None, slow_open).run)
            main.forwarder = ReadForwarder(tmp_path, 0, nursery)
            other.forwarder = ReadForwarder(tmp_path, 1, nursery)
            a = await other.lookup(ROOT_INODE, "a")
            d_inode = (await other.lookup(a.inode, "d.bin")).inode
            shared.hinted.add("a/d.bin")
            with trio.move_on_after(0.01) as interrupted:
                await other.open(d_inode, os.O_RDONLY)
            assert interrupted.cancelled_caught
            assert other.forwarder.opens == 1
            etag = (await mem.get_properties("a/d.bin")).etag
            assert shared.versions.open_count(d_inode, etag) == 0
            main_scope.cancel()
