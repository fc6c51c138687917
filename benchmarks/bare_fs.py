"""The least a pyfuse3 filesystem on trio can do per file, for `floor.py` to measure.

    python benchmarks/bare_fs.py DATA_DIR MOUNTPOINT

Mounts DATA_DIR's tree read-only with every name, attribute and byte held in memory from the
start: a lookup is one dict lookup, a read one slice. It answers the kernel with the same
mount options, entry and attribute lifetimes, idle worker count and "no FLUSH" reply as the
daemon, so that what blobmount spends above it is blobmount's own. It stops when unmounted.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from typing import Any

import pyfuse3
import trio

#: as blobmount.daemon.FUSE_IDLE_WORKERS
IDLE_WORKERS = 16
#: seconds the kernel may keep names and attributes (blobmount's default is as long)
KERNEL_TIMEOUT_S = 3600.0
DIR_MODE = stat.S_IFDIR | 0o555
FILE_MODE = stat.S_IFREG | 0o444


class BareFilesystem(pyfuse3.Operations):  # type: ignore[misc]
    def __init__(self, root: str) -> None:
        super().__init__()
        #: (parent inode, name) -> inode
        self.children: dict[tuple[int, bytes], int] = {}
        self.sizes: dict[int, int] = {pyfuse3.ROOT_INODE: 0}
        self.data: dict[int, bytes] = {}
        folders = {".": pyfuse3.ROOT_INODE}
        for folder, subfolders, files in os.walk(root):
            parent = folders[os.path.relpath(folder, root)]
            for name in subfolders:
                inode = self._add(parent, name, 0)
                folders[os.path.relpath(os.path.join(folder, name), root)] = inode
            for name in files:
                with open(os.path.join(folder, name), "rb") as f:
                    content = f.read()
                self.data[self._add(parent, name, len(content))] = content

    def _add(self, parent: int, name: str, size: int) -> int:
        inode = len(self.sizes) + pyfuse3.ROOT_INODE
        self.children[(parent, os.fsencode(name))] = inode
        self.sizes[inode] = size
        return inode

    def _entry(self, inode: int) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        entry.entry_timeout = KERNEL_TIMEOUT_S
        entry.attr_timeout = KERNEL_TIMEOUT_S
        entry.st_mode = FILE_MODE if inode in self.data else DIR_MODE
        entry.st_nlink = 1
        entry.st_size = self.sizes[inode]
        entry.st_blksize = 4096
        entry.st_blocks = -(-entry.st_size // 512)
        return entry

    async def lookup(self, parent: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        inode = self.children.get((parent, name))
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._entry(inode)

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return self._entry(inode)

    async def opendir(self, inode: int, ctx: Any) -> int:
        return inode

    async def readdir(self, fh: int, start: int, token: Any) -> None:
        names = sorted((n, inode) for (parent, n), inode in self.children.items() if parent == fh)
        for i, (name, inode) in enumerate(names[start:], start):
            if not pyfuse3.readdir_reply(token, name, self._entry(inode), i + 1):
                return

    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    async def read(self, fh: int, offset: int, size: int) -> bytes:
        return self.data[fh][offset : offset + size]

    async def release(self, fh: int) -> None:
        pass

    async def flush(self, fh: int) -> None:
        raise pyfuse3.FUSEError(errno.ENOSYS)  # as blobmount: no FLUSH per close


def main(root: str, mountpoint: str) -> None:
    fs = BareFilesystem(root)
    pyfuse3.init(fs, mountpoint, {"fsname=bare", "ro", "default_permissions", "noatime"})
    try:
        trio.run(pyfuse3.main, IDLE_WORKERS)
    finally:
        pyfuse3.close(unmount=False)  # main() returns once the mount is gone


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
