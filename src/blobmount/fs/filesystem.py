"""BlobFilesystem: the mount's semantics in plain async Python.

No pyfuse3 here: handlers take and return plain values and raise `FsError` or
`blobmount.errors`; `fuse_ops` converts. readdir takes a replier callable, so tests collect
entries without FUSE.

Consistency: attributes and listings are cached for the attribute TTL (None = for the life of the
mount). An open file is pinned to the blob version (ETag) it had at open.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import trio

from blobmount.blocks.keys import BlobVersion
from blobmount.blocks.manager import BlockManager
from blobmount.errors import BlobNotFound
from blobmount.fs.errno_map import FsError
from blobmount.fs.readers import BlockReader, OpenReader
from blobmount.namespace.inodes import InodeTable, Node
from blobmount.namespace.listing import DirListing
from blobmount.namespace.names import valid_segment
from blobmount.storage.base import StorageClient

log = logging.getLogger(__name__)

#: kernel cache timeout used when the attribute TTL is unset (the view never changes)
FOREVER_S = 365 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class FsConfig:
    blob_prefix: str  # '' or ends with '/'
    ttl_s: float | None
    uid: int
    gid: int
    file_mode: int
    dir_mode: int
    mount_time: float  # epoch seconds, the mtime of folders without a marker blob
    block_size: int


@dataclass(frozen=True, slots=True)
class Attr:
    inode: int
    mode: int
    size: int
    mtime: float
    uid: int
    gid: int
    nlink: int
    blksize: int


@dataclass(frozen=True, slots=True)
class StatFs:
    block_size: int
    blocks: int
    files: int
    name_max: int


@dataclass(frozen=True, slots=True)
class OpenedFile:
    fh: int
    keep_cache: bool


class _DirHandle:
    __slots__ = ("listing", "node")

    def __init__(self, node: Node, listing: DirListing) -> None:
        self.node = node
        self.listing = listing


class _FileHandle:
    __slots__ = ("node", "reader", "version")

    def __init__(self, node: Node, version: BlobVersion, reader: OpenReader) -> None:
        self.node = node
        self.version = version
        self.reader = reader


Replier = Callable[[str, Attr, int], bool]

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


class BlobFilesystem:
    def __init__(self, storage: StorageClient, blocks: BlockManager, config: FsConfig) -> None:
        self._storage = storage
        self._blocks = blocks
        self.config = config
        self.inodes = InodeTable(trio.current_time())
        self._listings: dict[str, DirListing] = {}
        self._negative: dict[str, float] = {}
        self._dirs: dict[int, _DirHandle] = {}
        self._files: dict[int, _FileHandle] = {}
        self._fh = itertools.count(1)

    # -- helpers ---------------------------------------------------------------------------

    def _fresh(self, since: float) -> bool:
        ttl = self.config.ttl_s
        return ttl is None or trio.current_time() - since < ttl

    @property
    def kernel_timeout_s(self) -> float:
        return FOREVER_S if self.config.ttl_s is None else self.config.ttl_s

    def _blob_name(self, path: str) -> str:
        return self.config.blob_prefix + path

    def _node(self, inode: int) -> Node:
        node = self.inodes.get(inode)
        if node is None:
            raise FsError(errno.ENOENT, f"unknown inode {inode}")
        return node

    def attr(self, node: Node) -> Attr:
        cfg = self.config
        props = node.props
        mtime = props.last_modified if props is not None else cfg.mount_time
        if node.is_dir:
            # nlink 1: "unknown number of subfolders", so find(1) does not skip any
            return Attr(
                node.inode,
                stat.S_IFDIR | cfg.dir_mode,
                0,
                mtime,
                cfg.uid,
                cfg.gid,
                1,
                cfg.block_size,
            )
        size = props.size if props is not None else 0
        return Attr(
            node.inode,
            stat.S_IFREG | cfg.file_mode,
            size,
            mtime,
            cfg.uid,
            cfg.gid,
            1,
            cfg.block_size,
        )

    def _listing(self, path: str) -> DirListing | None:
        listing = self._listings.get(path)
        if listing is not None and not self._fresh(listing.created):
            del self._listings[path]
            return None
        return listing

    # -- lookup / getattr ------------------------------------------------------------------

    async def lookup(self, parent_inode: int, name: str) -> Node | None:
        """The node for `name` in the folder, counted as one kernel lookup; None if absent."""
        parent = self._node(parent_inode)
        if not parent.is_dir:
            raise FsError(errno.ENOTDIR)
        if not valid_segment(name):
            return None
        path = f"{parent.path}/{name}" if parent.path else name
        node = await self._resolve(parent.path, name, path)
        if node is not None:
            node.lookups += 1
        return node

    async def _resolve(self, parent_path: str, name: str, path: str) -> Node | None:
        known = self.inodes.by_path(path)
        if known is not None and self._fresh(known.fetched):
            return known
        listing = self._listing(parent_path)
        if listing is not None:
            entry = listing.find(name)
            if entry is not None:
                return self.inodes.upsert(path, entry.is_dir, entry.props, listing.created)
            if listing.complete:
                return None
        negative = self._negative.get(path)
        if negative is not None and self._fresh(negative):
            return None
        return await self._probe(path)

    async def _probe(self, path: str) -> Node | None:
        """Ask storage what `path` is: a blob, a folder (some name below it), or nothing."""
        blob = self._blob_name(path)
        now = trio.current_time()
        try:
            props = await self._storage.get_properties(blob)
        except BlobNotFound:
            page = await self._storage.list_page(blob + "/", delimiter="/", max_results=1)
            if page.blobs or page.prefixes:
                return self.inodes.upsert(path, True, None, now)
            self._negative[path] = now
            return None
        self._negative.pop(path, None)
        return self.inodes.upsert(path, props.is_dir_marker, props, now)

    async def getattr(self, inode: int) -> Attr:
        node = self._node(inode)
        if not node.is_dir and not self._fresh(node.fetched):
            await self._refresh(node)
        return self.attr(node)

    async def _refresh(self, node: Node) -> None:
        try:
            props = await self._storage.get_properties(self._blob_name(node.path))
        except BlobNotFound:
            raise FsError(errno.ENOENT, f"{node.path} is gone") from None
        self.inodes.upsert(node.path, props.is_dir_marker, props, trio.current_time())

    def forget(self, pairs: Iterable[tuple[int, int]]) -> None:
        for inode, count in pairs:
            self.inodes.forget(inode, count)

    # -- folders ---------------------------------------------------------------------------

    async def opendir(self, inode: int) -> int:
        node = self._node(inode)
        if not node.is_dir:
            raise FsError(errno.ENOTDIR)
        listing = self._listing(node.path)
        if listing is None:
            prefix = self._blob_name(node.path + "/" if node.path else "")
            listing = DirListing(self._storage, prefix, trio.current_time())
            self._listings[node.path] = listing
        fh = next(self._fh)
        self._dirs[fh] = _DirHandle(node, listing)
        return fh

    async def readdir(self, fh: int, start: int, reply: Replier) -> None:
        """Hand entries from index `start` to `reply(name, attr, next_index)` until it returns
        False or the folder ends. Fetches list pages only as they are needed."""
        handle = self._dirs.get(fh)
        if handle is None:
            raise FsError(errno.EBADF)
        listing = handle.listing
        base = handle.node.path
        index = start
        while True:
            if index >= len(listing.entries):
                if listing.complete:
                    return
                await listing.ensure(index + 1)
                if index >= len(listing.entries):
                    return
            entry = listing.entries[index]
            path = f"{base}/{entry.name}" if base else entry.name
            node = self.inodes.upsert(path, entry.is_dir, entry.props, listing.created)
            if not reply(entry.name, self.attr(node), index + 1):
                return
            node.lookups += 1  # readdirplus: an accepted entry counts as a lookup
            index += 1

    def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    # -- files -----------------------------------------------------------------------------

    async def open(self, inode: int, flags: int) -> OpenedFile:
        if flags & _WRITE_FLAGS:
            raise FsError(errno.EROFS)
        node = self._node(inode)
        if node.is_dir:
            raise FsError(errno.EISDIR)
        if not self._fresh(node.fetched) or node.props is None:
            await self._refresh(node)
        props = node.props
        assert props is not None
        version = BlobVersion(self._blob_name(node.path), props.etag, props.size)
        # The kernel may keep pages from earlier opens only if they are of this same version.
        keep_cache = node.open_etag in (None, props.etag)
        node.open_etag = props.etag
        reader = BlockReader(self._blocks, self._blocks.open(version))
        fh = next(self._fh)
        self._files[fh] = _FileHandle(node, version, reader)
        return OpenedFile(fh, keep_cache)

    async def read(self, fh: int, offset: int, size: int) -> bytes:
        handle = self._files.get(fh)
        if handle is None:
            raise FsError(errno.EBADF)
        return await handle.reader.read(offset, size)

    def release(self, fh: int) -> None:
        handle = self._files.pop(fh, None)
        if handle is not None:
            handle.reader.close()

    @property
    def open_files(self) -> int:
        return len(self._files)

    def statfs(self) -> StatFs:
        return StatFs(
            block_size=self.config.block_size,
            blocks=0,
            files=len(self.inodes),
            name_max=255,
        )
