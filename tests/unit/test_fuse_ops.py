"""The pyfuse3 adapter over the real filesystem: the real BlobFilesystem and BlockManager over the
in-memory store (failures injected by FaultyStorageClient), answering in pyfuse3's own types.

What is checked: entries carry the filesystem's attributes and inode numbers; readdir hands the
kernel buffer what the listing has and stops when it is full; errors become FUSEError with the
mapped errno; writes get EROFS; the active-request count always comes back down, and
`wait_idle` waits for it. Only the kernel's readdir buffer is stood in for (`readdir_reply`
needs a real FUSE request)."""

from __future__ import annotations

import errno
import logging
import os
import stat

import pyfuse3
import pytest
import trio
import trio.testing

from blobmount.blocks.manager import BlockManager, BlockManagerConfig
from blobmount.errors import StorageUnavailable
from blobmount.fs.filesystem import FOREVER_S, BlobFilesystem, FsConfig
from blobmount.fs.fuse_ops import FuseOperations
from blobmount.namespace.inodes import ROOT_INODE, inode_for
from blobmount.storage.base import StorageClient
from blobmount.storage.faulty import FaultyStorageClient
from blobmount.storage.memory import InMemoryStorageClient
from tests.helpers.hooked_storage import Hooked

B = 64 * 1024
MOUNT_TIME = 1.7e9
DATA = bytes(range(256)) * 1000  # 256,000 bytes: four blocks
FILES = {"data.bin": DATA, "dir/a.txt": b"alpha", "dir/b.txt": b"bravo!", "top.txt": b"top"}


class Gated(Hooked):
    """Holds every ranged GET until `gate` is set (a storage request in flight)."""

    def __init__(self, inner: StorageClient) -> None:
        super().__init__(inner, self._wait)
        self.gate: trio.Event | None = None

    async def _wait(self, name: str, start: int) -> None:
        if self.gate is not None:
            await self.gate.wait()


class Stack:
    """FuseOperations over BlobFilesystem over BlockManager over (faulty, gated) memory."""

    def __init__(self, nursery: trio.Nursery, ttl_s: float | None = None) -> None:
        self.mem = InMemoryStorageClient()
        self.props = {name: self.mem.put(name, data) for name, data in FILES.items()}
        self.mem.put("marker", b"", dir_marker=True)
        self.faulty = FaultyStorageClient(self.mem)
        self.gated = Gated(self.faulty)
        blocks = BlockManager(self.gated, BlockManagerConfig(B, 4, 4, 16 * B, 16 * B), nursery)
        config = FsConfig("", ttl_s, 1234, 5678, 0o444, 0o555, MOUNT_TIME, B)
        self.fs = BlobFilesystem(self.gated, blocks, config)
        self.ops = FuseOperations(self.fs)

    async def open(self, path: str) -> int:
        parent = ROOT_INODE
        for name in path.split("/"):
            entry = await self.ops.lookup(parent, name.encode())
            parent = entry.st_ino
        info = await self.ops.open(parent, os.O_RDONLY, None)
        return int(info.fh)


@pytest.fixture
def stack(nursery: trio.Nursery) -> Stack:
    return Stack(nursery)


# -- entries and attributes ----------------------------------------------------------------


async def test_lookup_answers_with_the_filesystems_attributes(stack: Stack) -> None:
    entry = await stack.ops.lookup(ROOT_INODE, b"data.bin")
    props = stack.props["data.bin"]
    assert entry.st_ino == inode_for("data.bin")
    assert stack.fs.inodes.get(entry.st_ino).path == "data.bin"
    assert stat.S_ISREG(entry.st_mode)
    assert entry.st_mode & 0o777 == 0o444
    assert (entry.st_size, entry.st_blocks, entry.st_blksize) == (256_000, 500, B)
    assert (entry.st_uid, entry.st_gid, entry.st_nlink, entry.generation) == (1234, 5678, 1, 0)
    assert entry.st_mtime_ns == entry.st_ctime_ns == int(props.last_modified * 1e9)
    # no TTL: the view never changes, so the kernel may keep the entry "forever"
    assert entry.entry_timeout == entry.attr_timeout == FOREVER_S
    assert stack.ops.active_requests == 0

    folder = await stack.ops.lookup(ROOT_INODE, b"dir")
    assert folder.st_ino == inode_for("dir")
    assert stat.S_ISDIR(folder.st_mode)
    assert folder.st_mode & 0o777 == 0o555
    assert (folder.st_size, folder.st_mtime_ns) == (0, int(MOUNT_TIME * 1e9))

    again = await stack.ops.getattr(entry.st_ino, None)
    assert (again.st_ino, again.st_size, again.st_mtime_ns) == (
        entry.st_ino,
        entry.st_size,
        entry.st_mtime_ns,
    )


async def test_the_kernels_timeouts_follow_the_ttl(nursery: trio.Nursery) -> None:
    ops = Stack(nursery, ttl_s=2.5).ops
    entry = await ops.lookup(ROOT_INODE, b"top.txt")
    assert (entry.entry_timeout, entry.attr_timeout) == (2.5, 2.5)
    missing = await ops.lookup(ROOT_INODE, b"nope")
    assert (missing.st_ino, missing.entry_timeout) == (0, 2.5)


async def test_an_absent_name_is_a_cached_negative_entry(stack: Stack) -> None:
    for name in (b"nope", b"caf\xe9", b".."):  # missing, not UTF-8, not a blob name
        entry = await stack.ops.lookup(ROOT_INODE, name)
        assert (entry.st_ino, entry.entry_timeout) == (0, FOREVER_S), name


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("getattr of an unknown inode", errno.ENOENT),
        ("lookup in a file", errno.ENOTDIR),
        ("lookup of a name over 255 bytes", errno.ENAMETOOLONG),
        ("open of a folder", errno.EISDIR),
        ("opendir of a file", errno.ENOTDIR),
        ("read of an unknown handle", errno.EBADF),
        ("readdir of an unknown handle", errno.EBADF),
    ],
)
async def test_refusals_of_the_filesystem_become_their_errno(
    stack: Stack, call: str, expected: int
) -> None:
    ops = stack.ops
    top = (await ops.lookup(ROOT_INODE, b"top.txt")).st_ino
    folder = (await ops.lookup(ROOT_INODE, b"dir")).st_ino
    attempts = {
        "getattr of an unknown inode": lambda: ops.getattr(inode_for("nope"), None),
        "lookup in a file": lambda: ops.lookup(top, b"x"),
        "lookup of a name over 255 bytes": lambda: ops.lookup(ROOT_INODE, "é".encode() * 128),
        "open of a folder": lambda: ops.open(folder, os.O_RDONLY, None),
        "opendir of a file": lambda: ops.opendir(top, None),
        "read of an unknown handle": lambda: ops.read(999, 0, 4),
        "readdir of an unknown handle": lambda: ops.readdir(999, 0, None),
    }
    with pytest.raises(pyfuse3.FUSEError) as caught:
        await attempts[call]()
    assert caught.value.errno == expected
    assert ops.active_requests == 0


# -- folders -------------------------------------------------------------------------------


class KernelBuffer:
    """Stands in for pyfuse3.readdir_reply: keeps what it is given, holds `room` entries."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.replies: list[tuple[bytes, pyfuse3.EntryAttributes, int]] = []

    def __call__(self, token: object, name: bytes, entry: object, next_id: int) -> bool:
        assert token == "token"
        if len(self.replies) >= self.room:
            return False
        self.replies.append((name, entry, next_id))
        return True


async def test_readdir_replies_with_names_attributes_and_offsets(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    ops = stack.ops
    fh = await ops.opendir(ROOT_INODE, None)
    full = KernelBuffer(room=2)
    monkeypatch.setattr(pyfuse3, "readdir_reply", full)
    await ops.readdir(fh, 0, "token")
    # a page gives its folders (prefixes) first, then its blobs
    assert [(name, next_id) for name, _, next_id in full.replies] == [(b"dir", 1), (b"data.bin", 2)]
    # readdirplus: an accepted entry counts as a lookup, the refused third one does not
    assert stack.fs.inodes.get(inode_for("dir")).lookups == 1
    assert stack.fs.inodes.get(inode_for("marker")).lookups == 0

    rest = KernelBuffer(room=100)
    monkeypatch.setattr(pyfuse3, "readdir_reply", rest)
    await ops.readdir(fh, 2, "token")  # the kernel asks again from the last offset it took
    assert [(name, next_id) for name, _, next_id in rest.replies] == [
        (b"marker", 3),
        (b"top.txt", 4),
    ]
    entries = {name: entry for name, entry, _ in full.replies + rest.replies}
    assert entries[b"data.bin"].st_ino == inode_for("data.bin")
    assert entries[b"data.bin"].st_size == 256_000
    assert entries[b"top.txt"].st_size == 3
    assert stat.S_ISDIR(entries[b"marker"].st_mode)
    assert entries[b"marker"].st_ino == inode_for("marker")
    assert stack.fs.inodes.get(inode_for("marker")).lookups == 1
    await ops.releasedir(fh)
    assert stack.ops.active_requests == 0


async def test_readdir_of_a_subfolder_sends_utf8_names(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack.mem.put("dir/ünï 文件.txt", b"u")
    folder = await stack.ops.lookup(ROOT_INODE, b"dir")
    fh = await stack.ops.opendir(folder.st_ino, None)
    buffer = KernelBuffer(room=100)
    monkeypatch.setattr(pyfuse3, "readdir_reply", buffer)
    await stack.ops.readdir(fh, 0, "token")
    assert [name for name, _, _ in buffer.replies] == [
        b"a.txt",
        b"b.txt",
        "ünï 文件.txt".encode(),
    ]
    assert [entry.st_ino for _, entry, _ in buffer.replies] == [
        inode_for("dir/a.txt"),
        inode_for("dir/b.txt"),
        inode_for("dir/ünï 文件.txt"),
    ]


# -- files ---------------------------------------------------------------------------------


async def test_a_read_returns_the_blobs_bytes(stack: Stack) -> None:
    fh = await stack.open("data.bin")
    assert bytes(await stack.ops.read(fh, 0, 4)) == DATA[:4]
    assert bytes(await stack.ops.read(fh, B - 10, 20)) == DATA[B - 10 : B + 10]  # two blocks
    assert bytes(await stack.ops.read(fh, 255_990, 100)) == DATA[255_990:]  # past the end
    fh2 = await stack.open("dir/b.txt")
    assert bytes(await stack.ops.read(fh2, 0, 100)) == b"bravo!"
    assert stack.ops.active_requests == 0
    await stack.ops.release(fh)
    await stack.ops.release(fh2)
    assert stack.fs.open_files == 0


async def test_open_answers_with_a_handle_and_cache_flags(stack: Stack) -> None:
    inode = (await stack.ops.lookup(ROOT_INODE, b"top.txt")).st_ino
    first = await stack.ops.open(inode, os.O_RDONLY, None)
    second = await stack.ops.open(inode, os.O_RDONLY, None)
    assert first.fh != second.fh
    # same version both times: the kernel may keep its pages
    assert (first.keep_cache, first.direct_io) == (True, False)
    assert (second.keep_cache, second.direct_io) == (True, False)


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (StorageUnavailable("throttled"), errno.EIO),
        (OSError(errno.ENOSPC, "full"), errno.EIO),
        (RuntimeError("a bug"), errno.EIO),
        (pyfuse3.FUSEError(errno.EROFS), errno.EROFS),  # already an answer: passed on
    ],
)
async def test_storage_errors_become_fuse_errors(
    stack: Stack, raised: Exception, expected: int
) -> None:
    fh = await stack.open("top.txt")
    stack.faulty.fail_next("get_range", 1, raised)
    with pytest.raises(pyfuse3.FUSEError) as caught:
        await stack.ops.read(fh, 0, 4)
    assert caught.value.errno == expected
    assert stack.faulty.calls["get_range"] == 1
    assert stack.ops.active_requests == 0
    assert bytes(await stack.ops.read(fh, 0, 4)) == b"top"  # one request's failure, no more


async def test_a_deleted_blob_is_enoent(stack: Stack) -> None:
    fh = await stack.open("top.txt")
    stack.mem.delete("top.txt")
    with pytest.raises(pyfuse3.FUSEError) as caught:
        await stack.ops.read(fh, 0, 4)
    assert caught.value.errno == errno.ENOENT


async def test_an_unexpected_error_is_logged_with_its_traceback(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    fh = await stack.open("top.txt")
    stack.faulty.fail_next("get_range", 1, RuntimeError("a bug"))
    with caplog.at_level(logging.ERROR), pytest.raises(pyfuse3.FUSEError):
        await stack.ops.read(fh, 0, 4)
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage() == "read failed"
    assert record.exc_info is not None
    assert record.exc_info[0] is RuntimeError


# -- a read-only filesystem ----------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        "setattr",
        "mknod",
        "mkdir",
        "unlink",
        "rmdir",
        "symlink",
        "rename",
        "link",
        "create",
        "write",
        "setxattr",
        "removexattr",
    ],
)
async def test_every_write_type_operation_is_erofs(stack: Stack, call: str) -> None:
    with pytest.raises(pyfuse3.FUSEError) as caught:
        await getattr(stack.ops, call)(ROOT_INODE, b"x", 0o644, None)
    assert caught.value.errno == errno.EROFS
    # nothing changed in the store
    assert {b.name for b in (await stack.mem.list_page("", delimiter=None)).blobs} == {
        *FILES,
        "marker",
    }


@pytest.mark.parametrize("flags", [os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_APPEND])
async def test_opening_for_writing_is_erofs(stack: Stack, flags: int) -> None:
    inode = (await stack.ops.lookup(ROOT_INODE, b"top.txt")).st_ino
    with pytest.raises(pyfuse3.FUSEError) as caught:
        await stack.ops.open(inode, flags, None)
    assert caught.value.errno == errno.EROFS
    assert stack.fs.open_files == 0


async def test_access_flush_fsync_and_statfs(stack: Stack) -> None:
    ops = stack.ops
    assert await ops.access(ROOT_INODE, os.R_OK | os.X_OK, None)
    assert not await ops.access(ROOT_INODE, os.W_OK, None)
    with pytest.raises(pyfuse3.FUSEError) as caught:
        await ops.flush(1)
    assert caught.value.errno == errno.ENOSYS  # nothing to flush, ever: stop asking
    assert await ops.fsync(1, False) is None
    await ops.lookup(ROOT_INODE, b"dir")
    info = await ops.statfs(None)
    assert (info.f_bsize, info.f_frsize, info.f_namemax) == (B, B, 255)
    assert (info.f_blocks, info.f_bfree, info.f_bavail, info.f_ffree) == (0, 0, 0, 0)
    assert info.f_files == len(stack.fs.inodes) == 2  # the root and "dir"


# -- requests in progress ------------------------------------------------------------------


async def test_cancellation_is_not_turned_into_an_errno(stack: Stack) -> None:
    fh = await stack.open("top.txt")
    stack.gated.gate = trio.Event()
    with trio.move_on_after(0.01) as scope:
        await stack.ops.read(fh, 0, 4)
    assert scope.cancelled_caught
    assert stack.ops.active_requests == 0


async def test_wait_idle_waits_for_requests_in_progress(stack: Stack) -> None:
    ops = stack.ops
    fh = await stack.open("data.bin")
    await ops.wait_idle()  # nothing in progress: returns at once
    gate = stack.gated.gate = trio.Event()
    done: list[str] = []

    async def read(offset: int) -> None:
        assert bytes(await ops.read(fh, offset, 8)) == DATA[offset : offset + 8]
        done.append("read")

    async def wait() -> None:
        await ops.wait_idle()
        done.append("idle")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read, 0)
        nursery.start_soon(read, 2 * B)
        await trio.testing.wait_all_tasks_blocked()
        assert ops.active_requests == 2
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        assert done == []
        gate.set()
    assert done == ["read", "read", "idle"]
    await ops.wait_idle()


# -- requests counted (each process's share, in the stats) -----------------------------------


async def test_every_request_taken_is_counted_errors_and_refusals_too(stack: Stack) -> None:
    ops = stack.ops
    assert ops.requests == 0
    fh = await stack.open("top.txt")  # lookup, open
    await ops.read(fh, 0, 4)
    with pytest.raises(pyfuse3.FUSEError):
        await ops.flush(fh)  # ENOSYS: still a request taken
    await ops.release(fh)
    await ops.lookup(ROOT_INODE, b"absent")  # a negative entry
    with pytest.raises(pyfuse3.FUSEError):
        await ops.mkdir(ROOT_INODE, b"x", 0o755, None)  # EROFS
    await ops.forget([(inode_for("top.txt"), 1)])
    await ops.statfs(None)
    await ops.access(ROOT_INODE, os.R_OK, None)
    await ops.fsync(fh, False)
    assert ops.requests == 11
