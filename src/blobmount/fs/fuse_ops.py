"""pyfuse3 adapter: converts between pyfuse3 and BlobFilesystem, nothing more.

Only FUSEError leaves a handler: every other exception is mapped through `errno_map` (and logged,
unexpected ones with a traceback), so a bug or a storage failure costs one request an errno and
never the daemon. Every write-type operation answers EROFS.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, cast

import pyfuse3
import trio

from blobmount.fs import wakeup
from blobmount.fs.errno_map import errno_for
from blobmount.fs.filesystem import Attr, BlobFilesystem

log = logging.getLogger(__name__)


class _Request:
    """Wraps the handling of one request (``with ops._read_request: ...``): counts it as
    active, and turns any exception other than FUSEError into one, with an errno from
    `errno_map`.

    A plain context manager, not an async one: nothing in it awaits, and an async generator per
    request costs a FUSE request several microseconds more."""

    __slots__ = ("_ops", "_what")

    def __init__(self, ops: FuseOperations, what: str) -> None:
        self._ops = ops
        self._what = what

    def __enter__(self) -> None:
        self._ops.took_request()
        self._ops.active_requests += 1

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._ops._request_ended()
        # FUSEError is the answer; BaseExceptions (trio.Cancelled, KeyboardInterrupt) go on
        if exc is None or isinstance(exc, pyfuse3.FUSEError) or not isinstance(exc, Exception):
            return
        value, level = errno_for(exc)
        if level >= logging.ERROR and not isinstance(exc, OSError | ValueError):
            log.error("%s failed", self._what, exc_info=exc)
        else:
            log.log(level, "%s failed: %s", self._what, exc)
        raise pyfuse3.FUSEError(value) from None


class FuseOperations(pyfuse3.Operations):  # type: ignore[misc]
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, fs: BlobFilesystem | None = None) -> None:
        super().__init__()
        #: None only until a multi-process mount has built this process's filesystem: pyfuse3
        #: takes the operations at mount time, before the processes fork, and no request but
        #: INIT reaches a process before it serves
        self.fs = cast(BlobFilesystem, fs)
        self.active_requests = 0
        #: requests this process has taken from the kernel (per process: each counts its own)
        self.requests = 0
        #: set when active_requests drops to 0; made only while someone waits for that
        self._idle: trio.Event | None = None
        # one per kind of request: they hold no state of their own, only its name
        self._lookup_request = _Request(self, "lookup")
        self._getattr_request = _Request(self, "getattr")
        self._opendir_request = _Request(self, "opendir")
        self._readdir_request = _Request(self, "readdir")
        self._open_request = _Request(self, "open")
        self._read_request = _Request(self, "read")
        #: called while the kernel's INIT request is handled, before it is answered
        self.on_init: Callable[[], None] | None = None

    def init(self) -> None:
        if self.on_init is not None:
            try:
                self.on_init()
            except Exception:  # init must not raise: it answers no particular request
                log.exception("mount init hook failed")

    # -- plumbing --------------------------------------------------------------------------

    def took_request(self) -> None:
        """Called first by every handler: the read that brought its request did not block
        (multicore.md, the blocked-read timer), and one more request is counted."""
        wakeup.disarm()
        self.requests += 1

    async def wait_idle(self) -> None:
        """Return once no request is being served."""
        if self.active_requests:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()

    def _request_ended(self) -> None:
        self.active_requests -= 1
        if self.active_requests == 0 and self._idle is not None:
            self._idle.set()
            self._idle = None

    def _entry(self, attr: Attr) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = attr.inode
        entry.generation = 0
        entry.entry_timeout = self.fs.kernel_timeout_s
        entry.attr_timeout = self.fs.kernel_timeout_s
        entry.st_mode = attr.mode
        entry.st_nlink = attr.nlink
        entry.st_uid = attr.uid
        entry.st_gid = attr.gid
        entry.st_rdev = 0
        entry.st_size = attr.size
        entry.st_blksize = attr.blksize
        entry.st_blocks = -(-attr.size // 512)
        ns = int(attr.mtime * 1e9)
        entry.st_atime_ns = ns
        entry.st_mtime_ns = ns
        entry.st_ctime_ns = ns
        return entry

    # -- read-side operations --------------------------------------------------------------

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: Any = None
    ) -> pyfuse3.EntryAttributes:
        with self._lookup_request:
            node = await self.fs.lookup(parent_inode, name.decode("utf-8", "surrogateescape"))
            if node is None:
                # a negative entry the kernel caches for the attribute TTL
                entry = pyfuse3.EntryAttributes()
                entry.st_ino = 0
                entry.entry_timeout = self.fs.kernel_timeout_s
                return entry
            return self._entry(self.fs.attr(node))

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        with self._getattr_request:
            return self._entry(await self.fs.getattr(inode))

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        self.took_request()
        self.fs.forget(inode_list)

    async def opendir(self, inode: int, ctx: Any) -> int:
        with self._opendir_request:
            return await self.fs.opendir(inode)

    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        with self._readdir_request:

            def reply(name: str, attr: Attr, next_id: int) -> bool:
                return bool(
                    pyfuse3.readdir_reply(
                        token, name.encode("utf-8", "surrogateescape"), self._entry(attr), next_id
                    )
                )

            await self.fs.readdir(fh, start_id, reply)

    async def releasedir(self, fh: int) -> None:
        self.took_request()
        self.fs.releasedir(fh)

    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        with self._open_request:
            opened = await self.fs.open(inode, flags)
            if opened.preload is not None:
                self._store_in_page_cache(inode, opened.preload)
            return pyfuse3.FileInfo(
                fh=opened.fh, keep_cache=opened.keep_cache, direct_io=opened.direct_io
            )

    def _store_in_page_cache(self, inode: int, data: bytes) -> None:
        """Put a file's bytes in the kernel's page cache before its open is answered
        (FUSE_NOTIFY_STORE): its reads then take them from there, with no READ request. The
        pages are locked only by the kernel's own store: this inode's first open in the mount
        has no READ of it in flight. A kernel that refuses gets the READs as usual."""
        try:
            pyfuse3.notify_store(inode, 0, data)
        except OSError as exc:
            log.debug("cannot store inode %d in the page cache: %s", inode, exc)

    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:  # type: ignore[override]  # pyfuse3 takes any buffer
        with self._read_request:
            return await self.fs.read(fh, off, size)

    async def release(self, fh: int) -> None:
        self.took_request()
        self.fs.release(fh)

    async def flush(self, fh: int) -> None:
        # Nothing is ever written, so there is nothing to flush. ENOSYS (not success) tells the
        # kernel so once and for all: it stops sending FLUSH on every close(), one request per
        # opened file fewer, and close() still returns 0.
        self.took_request()
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def fsync(self, fh: int, datasync: bool) -> None:
        self.took_request()
        return None  # nothing is ever dirty

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        self.took_request()
        info = self.fs.statfs()
        data = pyfuse3.StatvfsData()
        data.f_bsize = info.block_size
        data.f_frsize = info.block_size
        data.f_blocks = info.blocks
        data.f_bfree = 0
        data.f_bavail = 0
        data.f_files = info.files
        data.f_ffree = 0
        data.f_favail = 0
        data.f_namemax = info.name_max
        return data

    async def access(self, inode: int, mode: int, ctx: Any) -> bool:
        self.took_request()
        return not mode & os.W_OK

    # -- write-side operations: a read-only filesystem -------------------------------------

    async def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        self.took_request()
        raise pyfuse3.FUSEError(errno.EROFS)

    setattr = _refuse
    mknod = _refuse
    mkdir = _refuse
    unlink = _refuse
    rmdir = _refuse
    symlink = _refuse
    rename = _refuse
    link = _refuse
    create = _refuse
    write = _refuse
    setxattr = _refuse
    removexattr = _refuse
