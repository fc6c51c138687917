"""A tiny stateless filesystem served by several processes through blobmount.fuse_processes.

    python -m tests.helpers.multiproc_fs MOUNTPOINT PROCESSES SERVED_LOG

`FILES` files `f000`.. in the root, file i holding `content(i)`. A file handle is its inode, so
any process can answer any request (the real daemon's shared state is another matter). Every
read appends "<pid>\n" to SERVED_LOG, so a test sees which processes served. Prints
"ready <zygote pid>" once the workers have been started, and each worker event as it comes
("started 1 4242 0", "ended 1 4242 -9"). Unmounting (fusermount3 -u) ends every process.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from typing import Any

import pyfuse3
import trio

from blobmount.fuse_processes import EXIT_CONNECTION_ENDED, Zygote, answer_init

FILES = 300
SIZE = 5_000
FIRST_INODE = 10


def content(index: int) -> bytes:
    return (f"file {index:03d} ".encode() * SIZE)[:SIZE]


class TinyFs(pyfuse3.Operations):  # type: ignore[misc]
    def __init__(self, served_log: str) -> None:
        super().__init__()
        self.served_log = served_log
        self.on_init: Any = None

    def init(self) -> None:
        if self.on_init is not None:
            self.on_init()

    def _index(self, inode: int) -> int:
        index = inode - FIRST_INODE
        if not 0 <= index < FILES:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return index

    def _attr(self, inode: int) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = inode
        if inode == pyfuse3.ROOT_INODE:
            attr.st_mode = stat.S_IFDIR | 0o555
        else:
            self._index(inode)
            attr.st_mode = stat.S_IFREG | 0o444
            attr.st_size = SIZE
        attr.entry_timeout = attr.attr_timeout = 60.0
        return attr

    async def lookup(self, parent: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        text = name.decode()
        if parent != pyfuse3.ROOT_INODE or not (text.startswith("f") and text[1:].isdigit()):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(FIRST_INODE + int(text[1:]))

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return self._attr(inode)

    async def opendir(self, inode: int, ctx: Any) -> int:
        return inode

    async def readdir(self, fh: int, start: int, token: Any) -> None:
        for index in range(start, FILES):
            name = f"f{index:03d}".encode()
            if not pyfuse3.readdir_reply(token, name, self._attr(FIRST_INODE + index), index + 1):
                return

    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        self._index(inode)
        # direct_io: every read reaches a process, none is served from the page cache
        return pyfuse3.FileInfo(fh=inode, direct_io=True)

    async def read(self, fh: int, offset: int, size: int) -> bytes:
        with open(self.served_log, "a") as log:
            log.write(f"{os.getpid()}\n")
        return content(self._index(fh))[offset : offset + size]

    async def release(self, fh: int) -> None:
        pass


def serve(fs: TinyFs) -> int:
    """One process's FUSE loop; returns when the connection ends."""
    try:
        trio.run(pyfuse3.main, 4)
    except OSError as exc:
        return 0 if exc.errno in (errno.ENODEV, errno.EBADF) else 1
    return EXIT_CONNECTION_ENDED


def main() -> int:
    mountpoint, processes, served_log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    fs = TinyFs(served_log)
    pyfuse3.init(fs, mountpoint, ["fsname=multiproc-test", "ro"])

    def hook(callback: Any) -> None:
        fs.on_init = callback

    answer_init(hook)
    zygote = Zygote(processes - 1, lambda index: serve(fs))
    zygote.start()
    print(f"ready {zygote.pid}", flush=True)

    async def leader() -> None:
        async with trio.open_nursery() as nursery:

            async def relay_events() -> None:
                while True:
                    await trio.lowlevel.wait_readable(zygote.events_fd)
                    for event in zygote.read_events():
                        print(event.encode().decode().strip(), flush=True)

            nursery.start_soon(relay_events)
            try:
                await pyfuse3.main(4)
            finally:
                nursery.cancel_scope.cancel()

    try:
        trio.run(leader)
    except OSError as exc:
        if exc.errno not in (errno.ENODEV, errno.EBADF):
            raise
    finally:
        zygote.stop()
        pyfuse3.close(unmount=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
