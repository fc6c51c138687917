"""pyfuse3 adapter: converts between pyfuse3 and BlobFilesystem, nothing more.

Only FUSEError leaves a handler: every other exception is mapped through `errno_map` (and logged,
unexpected ones with a traceback), so a bug or a storage failure costs one request an errno and
never the daemon. Every write-type operation answers EROFS.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pyfuse3
import trio

from blobmount.fs.errno_map import errno_for
from blobmount.fs.filesystem import Attr, BlobFilesystem

log = logging.getLogger(__name__)


class FuseOperations(pyfuse3.Operations):  # type: ignore[misc]
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, fs: BlobFilesystem) -> None:
        super().__init__()
        self.fs = fs
        self.active_requests = 0
        self._idle = trio.Event()
        self._idle.set()
        #: called while the kernel's INIT request is handled, before it is answered
        self.on_init: Callable[[], None] | None = None

    def init(self) -> None:
        if self.on_init is not None:
            try:
                self.on_init()
            except Exception:  # init must not raise: it answers no particular request
                log.exception("mount init hook failed")

    # -- plumbing --------------------------------------------------------------------------

    @asynccontextmanager
    async def _request(self, what: str) -> AsyncIterator[None]:
        self.active_requests += 1
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        try:
            yield
        except pyfuse3.FUSEError:
            raise
        except Exception as exc:
            value, level = errno_for(exc)
            if level >= logging.ERROR and not isinstance(exc, OSError | ValueError):
                log.exception("%s failed", what)
            else:
                log.log(level, "%s failed: %s", what, exc)
            raise pyfuse3.FUSEError(value) from None
        finally:
            self.active_requests -= 1
            if self.active_requests == 0:
                self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no request is being served."""
        await self._idle.wait()

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
        async with self._request("lookup"):
            node = await self.fs.lookup(parent_inode, name.decode("utf-8", "surrogateescape"))
            if node is None:
                # a negative entry the kernel caches for the attribute TTL
                entry = pyfuse3.EntryAttributes()
                entry.st_ino = 0
                entry.entry_timeout = self.fs.kernel_timeout_s
                return entry
            return self._entry(self.fs.attr(node))

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        async with self._request("getattr"):
            return self._entry(await self.fs.getattr(inode))

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        self.fs.forget(inode_list)

    async def opendir(self, inode: int, ctx: Any) -> int:
        async with self._request("opendir"):
            return await self.fs.opendir(inode)

    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        async with self._request("readdir"):

            def reply(name: str, attr: Attr, next_id: int) -> bool:
                return bool(
                    pyfuse3.readdir_reply(
                        token, name.encode("utf-8", "surrogateescape"), self._entry(attr), next_id
                    )
                )

            await self.fs.readdir(fh, start_id, reply)

    async def releasedir(self, fh: int) -> None:
        self.fs.releasedir(fh)

    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        async with self._request("open"):
            opened = await self.fs.open(inode, flags)
            return pyfuse3.FileInfo(
                fh=opened.fh, keep_cache=opened.keep_cache, direct_io=opened.direct_io
            )

    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:  # type: ignore[override]  # pyfuse3 takes any buffer
        async with self._request("read"):
            return await self.fs.read(fh, off, size)

    async def release(self, fh: int) -> None:
        self.fs.release(fh)

    async def flush(self, fh: int) -> None:
        # Nothing is ever written, so there is nothing to flush. ENOSYS (not success) tells the
        # kernel so once and for all: it stops sending FLUSH on every close(), one request per
        # opened file fewer, and close() still returns 0.
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def fsync(self, fh: int, datasync: bool) -> None:
        return None  # nothing is ever dirty

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
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
        return not mode & os.W_OK

    # -- write-side operations: a read-only filesystem -------------------------------------

    async def _refuse(self, *args: Any, **kwargs: Any) -> Any:
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
