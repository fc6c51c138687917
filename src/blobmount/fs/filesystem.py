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
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import trio

from blobmount.blocks.keys import BlobVersion, BlockKey
from blobmount.blocks.manager import BlockManager
from blobmount.errors import BlobNotFound
from blobmount.fs.errno_map import FsError
from blobmount.fs.forward import (
    MAIN_PROCESS,
    NOTE_CLOSED,
    NOTE_OPENED,
    NOTE_USED,
    ForwardFailed,
    ReadForwarder,
    ReadServer,
)
from blobmount.fs.readers import BlockReader, OpenReader, WholeFileReader
from blobmount.namespace.catalog import CatalogStats, ListingCatalog
from blobmount.namespace.inodes import InodeTable, Node
from blobmount.namespace.listing import DirEntry, DirListing
from blobmount.namespace.names import (
    NAME_MAX,
    NOT_UNICODE,
    TOO_LONG,
    UnsafeName,
    path_segments,
    segment_problem,
)
from blobmount.storage.base import StorageClient
from blobmount.wholefile.cache import WholeFileCache

if TYPE_CHECKING:  # only multi-process mounts build one
    from blobmount.multiproc.handles import HandleRecord
    from blobmount.multiproc.namespace import SharedNamespace

log = logging.getLogger(__name__)

#: kernel cache timeout used when the attribute TTL is unset (the view never changes)
FOREVER_S = 365 * 24 * 3600.0
#: how often a multi-process mount looks for handles another process released
SWEEP_INTERVAL_S = 0.2
#: ... and how often it looks while it gets no request of a handle (an idle job)
IDLE_SWEEP_S = 1.0


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
    listing_mode: str = "auto"  # see namespace.catalog


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
class NamespaceStats:
    inodes: int
    open_files: int
    open_dirs: int
    catalog: CatalogStats
    #: multi-process mounts: READs of another process's handle passed to it and answered, and
    #: those it could not be asked (gone, being replaced) and were read here
    forwarded_reads: int = 0
    forward_failures: int = 0
    #: forwarded READs whose bytes came back in shared memory (fs/forward.py's answer area), not
    #: through the socket
    forwarded_in_area: int = 0
    #: OPENs of a file the main process has read-order hints for, passed to it
    forwarded_opens: int = 0
    #: OPENs of such a file made here, its hinted blocks read from the main process's shelf
    shelf_opens: int = 0
    #: notices of those opens and closes that did not reach the main process
    notices_lost: int = 0


@dataclass(frozen=True, slots=True)
class OpenedFile:
    fh: int
    keep_cache: bool
    direct_io: bool = False
    #: the whole file's bytes, for the kernel's page cache before the open is answered (a
    #: small file in whole-file mode, opened for the first time): its reads then need no READ
    preload: bytes | None = None


class _DirHandle:
    __slots__ = ("listing", "node")

    def __init__(self, node: Node, listing: DirListing) -> None:
        self.node = node
        self.listing = listing


class _FileHandle:
    __slots__ = ("node", "noted", "opened_here", "reader", "version")

    def __init__(
        self, node: Node, version: BlobVersion, reader: OpenReader, opened_here: bool = True
    ) -> None:
        self.node = node
        self.version = version
        self.reader = reader
        #: False for a handle another process of the mount opened (its READs landed here)
        self.opened_here = opened_here
        #: opened here in place of the main process, which is told of its close too
        self.noted = False


Replier = Callable[[str, Attr, int], bool]


class OpenListener(Protocol):
    """Told when a blob version is opened and closed (the hint coordinator)."""

    def opened(self, version: BlobVersion) -> None: ...

    def closed(self, version: BlobVersion) -> None: ...


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


def _kernel_bytes(name: str) -> int:
    """The length of a kernel name that is not UTF-8 (it arrives surrogate-escaped); 0 for a
    string no kernel could send."""
    try:
        return len(name.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        return 0


class BlobFilesystem:
    def __init__(
        self,
        storage: StorageClient,
        blocks: BlockManager,
        config: FsConfig,
        whole_files: WholeFileCache | None = None,
        shared: SharedNamespace | None = None,
    ) -> None:
        self._storage = storage
        #: set when several processes serve the mount: any request may land in any of them
        #: (docs/developer-notes/multicore.md), so inodes, handles and the page-cache rules of
        #: open versions are resolved through this
        self._shared = shared
        self._last_sweep = 0.0
        self._blocks = blocks
        #: set in whole-file mode; files it cannot hold are read through `blocks`
        self._whole_files = whole_files
        self.open_listener: OpenListener | None = None
        #: with several processes: passes READs of other processes' handles to their opener
        self.forwarder: ReadForwarder | None = None
        #: the server of the requests other processes pass here (several processes only)
        self.read_server: ReadServer | None = None
        self._shelf_opens = 0
        self.config = config
        self.inodes = InodeTable(trio.current_time())
        self.catalog = ListingCatalog(
            storage,
            self.inodes,
            config.blob_prefix,
            config.listing_mode,
            config.ttl_s,
            trio.current_time,
        )
        self._dirs: dict[int, _DirHandle] = {}
        self._files: dict[int, _FileHandle] = {}
        #: per inode, the versions (ETags) its open handles are pinned to, with counts
        self._open_etags: dict[int, Counter[str]] = {}
        self._fh = itertools.count(1)

    # -- helpers ---------------------------------------------------------------------------

    def _fresh(self, since: float) -> bool:
        return self.catalog.fresh(since)

    @property
    def kernel_timeout_s(self) -> float:
        return FOREVER_S if self.config.ttl_s is None else self.config.ttl_s

    def _blob_name(self, path: str) -> str:
        return self.config.blob_prefix + path

    def _dir_prefix(self, node: Node) -> str:
        return self._folder_prefix(node.path)

    def _folder_prefix(self, path: str) -> str:
        return self._blob_name(path + "/" if path else "")

    def _node(self, inode: int) -> Node:
        node = self.inodes.get(inode)
        if node is None:
            raise FsError(errno.ENOENT, f"unknown inode {inode}")
        return node

    async def _adopt(self, inode: int) -> Node:
        """The node of an inode number another process of the mount handed to the kernel: its
        path from the shared names, then resolved here as a lookup would (listings cached)."""
        path = None if self._shared is None else self._shared.names.path_of(inode)
        if path is None:
            raise FsError(errno.ENOENT, f"unknown inode {inode}")
        node = self.inodes.root
        for name in path.split("/"):
            child = await self._resolve(node, name)
            if child is None:
                raise FsError(errno.ENOENT, f"{path} is gone")
            node = child
        if node.inode != inode:
            # a hash collision probed to another number here than in the process that handed
            # it out (about one path in two million per million paths): not resolvable
            raise FsError(errno.ENOENT, f"{path} has inode {node.inode} here, not {inode}")
        return node

    def attr(self, node: Node) -> Attr:
        cfg = self.config
        mtime = node.mtime or cfg.mount_time
        if node.is_dir:
            # nlink 1: "unknown number of subfolders", so find(1) does not skip any
            mode, size = stat.S_IFDIR | cfg.dir_mode, 0
        else:
            mode, size = stat.S_IFREG | cfg.file_mode, node.size
        return Attr(node.inode, mode, size, mtime, cfg.uid, cfg.gid, 1, cfg.block_size)

    # -- lookup / getattr ------------------------------------------------------------------

    async def lookup(self, parent_inode: int, name: str) -> Node | None:
        """The node for `name` in the folder, counted as one kernel lookup; None if absent."""
        parent = self.inodes.get(parent_inode) or await self._adopt(parent_inode)
        if not parent.is_dir:
            raise FsError(errno.ENOTDIR)
        why = segment_problem(name)
        if why is not None:
            # a name no listing would show is absent without asking storage, unless it is too
            # long (ENAMETOOLONG: what statfs's name_max promises)
            if why == TOO_LONG or (why == NOT_UNICODE and _kernel_bytes(name) > NAME_MAX):
                raise FsError(errno.ENAMETOOLONG)
            return None
        node = await self._resolve(parent, name)
        if node is not None:
            node.lookups += 1
            if self._shared is not None:
                self._shared.names.publish(node.inode, node.path)
        return node

    async def _resolve(self, parent: Node, name: str) -> Node | None:
        known = self.inodes.child(parent, name)
        if known is not None and self._fresh(known.fetched):
            return known
        path = parent.child_path(name)
        if self.catalog.known_missing(path):
            return None
        listing = self.catalog.listing_for_lookups(self._dir_prefix(parent))
        if listing is not None:
            if not listing.entries and not listing.complete:
                await listing.ensure(1)  # the first page: often the whole folder
            listed = listing.find(name)
            if listed is not None:
                return self.inodes.upsert(parent, listed, listing.created)
            if listing.complete:
                return None
        entry = await self._probe(path, name)
        if entry is None:
            self.catalog.note_missing(path)
            return None
        self.catalog.forget_missing(path)
        return self.inodes.upsert(parent, entry, trio.current_time())

    async def _probe(self, path: str, name: str) -> DirEntry | None:
        """Ask storage what `path` is: a blob (one properties request), a folder (then one
        one-item prefix probe), or nothing."""
        blob = self._blob_name(path)
        try:
            props = await self._storage.get_properties(blob)
        except BlobNotFound:
            page = await self._storage.list_page(blob + "/", delimiter="/", max_results=1)
            if page.blobs or page.prefixes:
                return DirEntry(name, True, 0, 0.0, None)
            return None
        return DirEntry.of(name, props.is_dir_marker, props)

    async def getattr(self, inode: int) -> Attr:
        node = self.inodes.get(inode) or await self._adopt(inode)
        if not node.is_dir and not self._fresh(node.fetched):
            await self._refresh(node)
        return self.attr(node)

    async def _refresh(self, node: Node) -> None:
        try:
            props = await self._storage.get_properties(self._blob_name(node.path))
        except BlobNotFound:
            raise FsError(errno.ENOENT, f"{node.path} is gone") from None
        node.update(DirEntry.of(node.name, props.is_dir_marker, props), trio.current_time())

    def forget(self, pairs: Iterable[tuple[int, int]]) -> None:
        for inode, count in pairs:
            self.inodes.forget(inode, count)

    # -- folders ---------------------------------------------------------------------------

    async def opendir(self, inode: int) -> int:
        node = self.inodes.get(inode) or await self._adopt(inode)
        if not node.is_dir:
            raise FsError(errno.ENOTDIR)
        fh = next(self._fh) if self._shared is None else self._shared.handles.add(inode, None, 0)
        self._dirs[fh] = self._dir_handle(node)
        return fh

    def _dir_handle(self, node: Node) -> _DirHandle:
        parent = None if node.folder is None else self._folder_prefix(node.folder)
        return _DirHandle(node, self.catalog.for_folder(self._dir_prefix(node), parent))

    async def _adopt_dir_handle(self, fh: int) -> _DirHandle:
        """A folder handle another process opened: this process's own listing of the folder
        (the same entries in the same order while the listing is fresh)."""
        record = None if self._shared is None else self._shared.handles.get(fh)
        if record is None:
            raise FsError(errno.EBADF)
        node = self.inodes.get(record.inode) or await self._adopt(record.inode)
        handle = self._dirs[fh] = self._dir_handle(node)
        return handle

    async def readdir(self, fh: int, start: int, reply: Replier) -> None:
        """Hand entries from index `start` to `reply(name, attr, next_index)` until it returns
        False, the folder ends, or the next entry needs another list page while this request
        already holds some: the kernel's buffer can take ~6,000 entries, and the reader should
        get the first page's entries without waiting for the second (the kernel asks again)."""
        handle = self._dirs.get(fh) or await self._adopt_dir_handle(fh)
        # the entries handed out, for the other processes: published in one go before the
        # reply goes out (the kernel learns their numbers from the reply alone)
        handed: list[tuple[int, str]] | None = None if self._shared is None else []
        try:
            await self._reply_entries(handle, start, reply, handed)
        finally:
            if handed and self._shared is not None:
                self._shared.names.publish_all(handed)

    async def _reply_entries(
        self,
        handle: _DirHandle,
        start: int,
        reply: Replier,
        handed: list[tuple[int, str]] | None,
    ) -> None:
        listing = handle.listing
        index = start
        while True:
            if index >= len(listing.entries):
                if listing.complete or index > start:
                    return
                await listing.ensure(index + 1)
                if index >= len(listing.entries):
                    return
            entry = listing.entries[index]
            node = self.inodes.upsert(handle.node, entry, listing.created)
            if not reply(entry.name, self.attr(node), index + 1):
                self.inodes.release_if_unused(node)
                return
            node.lookups += 1  # readdirplus: an accepted entry counts as a lookup
            if handed is not None:
                handed.append((node.inode, node.path))
            index += 1

    def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)
        if self._shared is not None:
            self._shared.handles.remove(fh)

    def statistics(self) -> NamespaceStats:
        return NamespaceStats(
            inodes=len(self.inodes),
            # a handle another process opened and this one read is that process's to count
            open_files=sum(handle.opened_here for handle in self._files.values()),
            open_dirs=len(self._dirs),
            catalog=self.catalog.statistics(),
            forwarded_reads=0 if self.forwarder is None else self.forwarder.forwarded,
            forward_failures=0 if self.forwarder is None else self.forwarder.failed,
            forwarded_in_area=0 if self.forwarder is None else self.forwarder.in_area,
            forwarded_opens=0 if self.forwarder is None else self.forwarder.opens,
            shelf_opens=self._shelf_opens,
            notices_lost=0 if self.forwarder is None else self.forwarder.notices_lost,
        )

    # -- files -----------------------------------------------------------------------------

    async def open(self, inode: int, flags: int, *, for_another: bool = False) -> OpenedFile:
        """Open `inode`; `for_another`: for another process of the mount, which passed the
        OPEN here because this process has hints for the file (so its READs come here too)."""
        if flags & _WRITE_FLAGS:
            raise FsError(errno.EROFS)
        node = self.inodes.get(inode) or await self._adopt(inode)
        if node.is_dir:
            raise FsError(errno.EISDIR)
        version = await self._current_version(node)
        hinted = shelved = main = False
        if self._shared is not None:
            main = self.forwarder is None or self.forwarder.index == MAIN_PROCESS
            hinted = self._hinted_by_main(version, main)
            shelved = hinted and self._on_shelf(version)
            if hinted and not shelved and not main and not for_another:
                opened = await self._open_in_hints_process(inode, flags, version)
                if opened is not None:
                    return opened
        etag = version.etag
        reader = await self._open_reader(version, shelved=shelved)
        # no await from here on: the bookkeeping below happens all or not at all
        if self._shared is not None:
            # the main process's hinted blocks in its memory: every READ is to come to it
            by_owner = for_another or (main and hinted and not shelved)
            return self._open_shared(
                node,
                version,
                reader,
                by_owner=by_owner,
                shelved=shelved,
                noted=shelved and not main,
            )
        open_etags = self._open_etags.setdefault(node.inode, Counter())
        preload: bytes | None = None
        if any(other != etag for other in open_etags):
            # The kernel's page cache is one per inode, shared by all handles, and handles
            # pinned to another version are open: this one bypasses it, so no handle ever reads
            # pages of the other version.
            keep_cache, direct_io = False, True
        else:
            # The kernel may keep pages from earlier opens only if they are of this same version.
            keep_cache, direct_io = node.open_etag in (None, etag), False
            if node.open_etag is None:
                # The kernel holds no page of this inode yet, so a read of it will come (docs/
                # developer-notes/concurrency.md has figures): a one-block file's GET starts
                # now, on the wire while the kernel answers the open and sends the READ; a
                # small file's copy in memory goes into the kernel's page cache with the open.
                if isinstance(reader, BlockReader):
                    reader.fetch_at_open()
                elif isinstance(reader, WholeFileReader):
                    preload = reader.preload()
            node.open_etag = etag
        open_etags[etag] += 1
        fh = next(self._fh)
        node.opens += 1
        self._files[fh] = _FileHandle(node, version, reader)
        if self.open_listener is not None:
            self.open_listener.opened(version)
        return OpenedFile(fh, keep_cache, direct_io, preload)

    async def open_for_another(self, inode: int, flags: int) -> tuple[int, bool, bool]:
        """`open` for another process (fs/forward.py): handle, keep_cache, direct_io."""
        opened = await self.open(inode, flags, for_another=True)
        return opened.fh, opened.keep_cache, opened.direct_io

    def _hinted_by_main(self, version: BlobVersion, main: bool) -> bool:
        """Whether the main process has hints for the blob (it writes the set: there, an empty
        one costs no lookup)."""
        assert self._shared is not None
        if main and len(self._shared.hinted) == 0:
            return False
        return self._shared.hinted.holds(version.name)

    def _on_shelf(self, version: BlobVersion) -> bool:
        """(block mode) Whether the main process's hinted blocks of `version` are on the shelf,
        where every process can read them: another process then opens the file itself, and
        tells the main process (one-way notices), in place of passing it the open, and the
        handle's READs are read wherever they land."""
        if self._whole_files is not None:
            return False
        return self._blocks.hinted.on_shelf(BlockKey(version.name, version.etag, 0))

    async def _open_in_hints_process(
        self, inode: int, flags: int, version: BlobVersion
    ) -> OpenedFile | None:
        """The open, made by the main process, which has hints for the blob (this being
        another process); None when it is to be opened here after all."""
        forwarder = self.forwarder
        if forwarder is None:
            return None
        # shielded: a handle the main process made for an open interrupted meanwhile would be
        # open for ever, so the answer is awaited and the handle released if nobody gets it
        with trio.CancelScope(shield=True):
            try:
                fh, keep_cache, direct_io = await forwarder.open(MAIN_PROCESS, inode, flags)
            except ForwardFailed as exc:
                log.info("opening %s here: %s", version.name, exc)
                return None
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
        except trio.Cancelled:
            self.release(fh)
            raise
        return OpenedFile(fh, keep_cache, direct_io)

    def _open_shared(
        self,
        node: Node,
        version: BlobVersion,
        reader: OpenReader,
        *,
        by_owner: bool,
        shelved: bool = False,
        noted: bool = False,
    ) -> OpenedFile:
        """The open of a mount several processes serve: the page-cache rules of `open` above
        applied to every process's handles of the inode (the shared open versions), and a handle
        number any process can resolve to the pinned version (`by_owner`: whose READs all come
        to this process; `shelved`: its hinted blocks are on the shelf; `noted`: opened from
        there in place of the main process, which is told)."""
        assert self._shared is not None
        keep_cache, direct_io = self._shared.versions.opened(node.inode, version.etag)
        try:
            fh = self._shared.handles.add(
                node.inode,
                version.etag,
                version.size,
                direct_io,
                by_owner=by_owner,
                shelved=shelved,
            )
        except BaseException:
            self._shared.versions.released(node.inode, version.etag, direct_io)
            reader.close()
            raise
        node.opens += 1
        handle = self._files[fh] = _FileHandle(node, version, reader)
        if noted:
            handle.noted = True
            self._shelf_opens += 1
            self._tell_main(NOTE_OPENED, version)
        if self.open_listener is not None:
            self.open_listener.opened(version)
        return OpenedFile(fh, keep_cache, direct_io)

    def _tell_main(self, kind: int, version: BlobVersion) -> None:
        assert self.forwarder is not None
        text = f"{version.name}\0{version.etag}".encode("utf-8", "surrogatepass")
        self.forwarder.post(MAIN_PROCESS, kind, text)

    def hint_notice(self, kind: int, text: bytes) -> None:
        """(main process) Another process opened or closed a hinted file in place of this one
        (fs/forward.py notices): the coordinator is told as if it had happened here."""
        name, _, etag = text.decode("utf-8", "surrogatepass").partition("\0")
        if self.open_listener is None or not etag:
            return
        version = BlobVersion(name, etag, 0)  # the coordinator goes by name and ETag
        if kind == NOTE_OPENED:
            self.open_listener.opened(version)
        elif kind in (NOTE_CLOSED, NOTE_USED):
            if kind == NOTE_USED:
                self._blocks.hinted.hand_over(name, etag)
            self.open_listener.closed(version)

    async def _adopt_file_handle(self, fh: int, record: HandleRecord) -> _FileHandle:
        """A file handle another process opened (the kernel sends a handle's READs to any
        process), from its shared `record`: a reader of the version that process pinned, never
        the current one."""
        assert record.etag is not None
        node = self.inodes.get(record.inode) or await self._adopt(record.inode)
        version = BlobVersion(self._blob_name(node.path), record.etag, record.size)
        reader = await self._open_reader(version, shelved=record.shelved)
        if fh in self._files:  # adopted by a concurrent read while this one awaited
            reader.close()
            return self._files[fh]
        node.opens += 1
        handle = self._files[fh] = _FileHandle(node, version, reader, opened_here=False)
        self._sweep_handles()
        return handle

    def _sweep_handles(self) -> None:
        """Close this process's copies of handles that were released in another process (the
        kernel sends RELEASE to one process only); at most a few times a second."""
        now = trio.current_time()
        if self._shared is None or now - self._last_sweep < SWEEP_INTERVAL_S:
            return
        self._last_sweep = now
        handles = self._shared.handles
        for fh in [fh for fh in self._files if handles.get(fh) is None]:
            self._close_file(fh)
        for fh in [fh for fh in self._dirs if handles.get(fh) is None]:
            del self._dirs[fh]

    async def sweep_while_idle(self) -> None:
        """(several processes) Close the handles another process released, also while no
        request comes here: until then a released handle would keep its reader (a whole-file
        copy's fd and its entry safe from pruning, a file's hinted blocks) for as long as the
        job is idle, and count as open in the stats."""
        while True:
            await trio.sleep(IDLE_SWEEP_S)
            if self._files or self._dirs:
                self._sweep_handles()

    async def version_of(self, path: str) -> BlobVersion | None:
        """The version an open of `path` (mount-relative, '/'-separated) would pin now, or None
        if it is not a file. Costs what the kernel's lookups of it would; the nodes it makes
        are not kept (the kernel does not know them)."""
        node = self.inodes.root
        try:
            for name in path_segments(path):
                if not node.is_dir:
                    return None
                child = await self._resolve(node, name)
                if child is None:
                    return None
                node = child
            if node.is_dir:
                return None
            return await self._current_version(node)
        except (FsError, UnsafeName):
            return None
        finally:
            self.inodes.release_if_unused(node)

    async def _current_version(self, node: Node) -> BlobVersion:
        """The version of a file node an open pins now (its properties refreshed if stale)."""
        etag = node.etag  # a property that formats the packed ETag: read it once
        if etag is None or not self._fresh(node.fetched):
            await self._refresh(node)
            etag = node.etag
        assert etag is not None
        return BlobVersion(self._blob_name(node.path), etag, node.size)

    async def _open_reader(self, version: BlobVersion, *, shelved: bool = False) -> OpenReader:
        if self._whole_files is not None:
            # one GET pinned to `version` when it is not cached (one for concurrent opens); a
            # small file is served from memory at once, the rest once the whole file is local
            copy = await self._whole_files.open(version)
            if copy is not None:
                return WholeFileReader(self._whole_files, copy)
        handle = self._blocks.open(version)
        handle.shelved = shelved
        return BlockReader(self._blocks, handle)

    async def read(self, fh: int, offset: int, size: int) -> bytes | memoryview:
        handle = self._files.get(fh)
        if handle is None:
            if self._shared is None:
                raise FsError(errno.EBADF)
            return await self._read_foreign(fh, offset, size)
        return await handle.reader.read(offset, size)

    async def _read_foreign(self, fh: int, offset: int, size: int) -> bytes | memoryview:
        """A READ of a handle another process opened. A file of several blocks (any file in
        whole-file mode), or one opened with its hinted blocks, is read by its opener, which
        holds its read-ahead, its copy or those blocks; a one-block file, or any file when the
        opener cannot be reached, is read here."""
        assert self._shared is not None
        handles = self._shared.handles
        record = handles.get(fh)
        if record is None or record.etag is None:
            raise FsError(errno.EBADF)
        forwarder = self.forwarder
        if (
            forwarder is not None
            and (owner := handles.owner(fh)) != forwarder.index
            and (
                record.by_owner
                or self._whole_files is not None
                or record.size > self.config.block_size
            )
        ):
            try:
                return await forwarder.read(owner, fh, offset, size)
            except ForwardFailed as exc:
                log.info("reading handle %d here: %s", fh, exc)
        handle = self._files.get(fh) or await self._adopt_file_handle(fh, record)
        return await handle.reader.read(offset, size)

    def release(self, fh: int) -> None:
        if self._shared is not None:
            record = self._shared.handles.remove(fh)
            if record is not None and record.etag is not None:
                self._shared.versions.released(record.inode, record.etag, record.direct_io)
            self._close_file(fh)
            self._sweep_handles()
            return
        handle = self._files.pop(fh, None)
        if handle is not None:
            handle.reader.close()
            if self.open_listener is not None:
                self.open_listener.closed(handle.version)
            etags = self._open_etags[handle.node.inode]
            etags[handle.version.etag] -= 1
            if etags[handle.version.etag] <= 0:
                del etags[handle.version.etag]
            if not etags:
                del self._open_etags[handle.node.inode]
            handle.node.opens -= 1
            self.inodes.release_if_unused(handle.node)

    def _close_file(self, fh: int) -> None:
        """This process's part of a released handle of a multi-process mount."""
        handle = self._files.pop(fh, None)
        if handle is None:
            return
        handle.reader.close()
        reader, version = handle.reader, handle.version
        if handle.opened_here and isinstance(reader, BlockReader) and reader.shelved:
            # (main process) what is left of its blocks was read by the process the READs
            # landed in (this one would have taken them): they leave as taken, not as unread
            self._blocks.hinted.hand_over(version.name, version.etag)
        if handle.opened_here and self.open_listener is not None:
            self.open_listener.closed(handle.version)
        if handle.noted:
            read = isinstance(handle.reader, BlockReader) and handle.reader.shelf_reads > 0
            self._tell_main(NOTE_USED if read else NOTE_CLOSED, handle.version)
        handle.node.opens -= 1
        self.inodes.release_if_unused(handle.node)

    @property
    def open_files(self) -> int:
        return sum(handle.opened_here for handle in self._files.values())

    def statfs(self) -> StatFs:
        return StatFs(
            block_size=self.config.block_size,
            blocks=0,
            files=len(self.inodes),
            name_max=NAME_MAX,
        )
