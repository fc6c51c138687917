"""Whole-file open mode: an opened blob version is downloaded whole into the cache directory,
and every read of it is then served from that local file.

Entries live under the cache directory's ``files/`` kind (see `cachedir.layout`): the entry name
is a hash of (blob name, ETag), so a new version of a blob is a new entry and an entry's bytes
never change. A download runs `download.transfer.Transfers` (parallel ranged GETs pinned to the
ETag, into a temporary file renamed when complete and checked against the blob's Content-MD5
when it has one), so a file under its final name is always a whole version.

Sharing: opens of the same version share one `LocalCopy` (one fd) while any of them is open, and
wait on one download while it runs. The download runs in the cache's own nursery, so an open
that is interrupted does not abort it for the others; when the last waiting open gives up, it
is cancelled (and its temporary removed).

Space: the same settings and `Pruner` as the block tier. Before downloading, the file's size is
reserved; if it does not fit, the pruner removes least-recently-used entries that are not open
(the `keep` hook). A file that cannot fit even then, or is larger than the whole cache, is not
cached: `open` returns None and the caller streams it in block mode instead. An entry's mtime is
its last use (set at every open), which is what the pruner orders by.

Integrity on reuse: an entry found on disk (from an earlier mount) is used only if its size is
the blob's, and, when the blob has a Content-MD5, once per process after its hash matches; an
entry that fails is removed and downloaded again.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio
from cachetools import LRUCache

from blobmount.blocks.keys import BlobVersion
from blobmount.cachedir.layout import (
    CacheLayout,
    allocated_bytes,
    free_bytes,
    temporary_path,
)
from blobmount.cachedir.pruner import Pruner, PrunerConfig, PrunerStats
from blobmount.cachedir.session import background_tasks, using_cache_dir
from blobmount.cachedir.space import SpaceConfig, allocated_size
from blobmount.download_mode.transfer import DEFAULT_PART_SIZE, TransferConfig, Transfers
from blobmount.errors import BlobChanged
from blobmount.storage.base import BlobProps, StorageClient
from blobmount.units import format_size

log = logging.getLogger(__name__)

KIND = "files"
#: blob names whose last cached ETag is remembered (to remove a replaced version's copy)
REMEMBERED_VERSIONS = 100_000
_HASH_CHUNK = 4 * 1024 * 1024
#: reads of local copies in worker threads at once (page-cache hits take microseconds, so this
#: only bounds threads stuck waiting for the disk)
READ_THREADS = 16


@dataclass(frozen=True, slots=True)
class WholeFileConfig:
    root: Path
    space: SpaceConfig
    #: ranged GETs in flight across all downloads (DATASET_MOUNT_READ_THREADS)
    download_slots: int
    part_size: int = DEFAULT_PART_SIZE
    rescan_interval_s: float = 300.0


@dataclass(frozen=True, slots=True)
class WholeFileStats:
    cache_dir: str
    #: bytes handed to readers from local copies
    served_bytes: int
    #: opens served by a copy already on disk or already open (no download)
    cached_opens: int
    #: opens that waited for a download another open had started
    shared_opens: int
    downloads: int
    downloaded_bytes: int
    failed_downloads: int
    #: opens streamed in block mode because the file does not fit in the cache
    fallbacks: int
    #: copies found damaged (wrong size or hash) and downloaded again
    corrupt: int
    open_copies: int
    space: PrunerStats


class LocalCopy:
    """One cached blob version, open for reading, shared by the handles open on it."""

    __slots__ = ("fd", "path", "size", "users")

    def __init__(self, path: Path, fd: int, size: int) -> None:
        self.path = path
        self.fd = fd
        self.size = size
        self.users = 0


class _Download:
    """A download in progress, and the opens waiting for it."""

    __slots__ = ("copy", "done", "error", "fits", "scope", "waiters")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.scope = trio.CancelScope()
        self.copy: LocalCopy | None = None
        self.error: Exception | None = None
        self.fits = True
        self.waiters = 0


class _DoesNotFit(Exception):
    pass


class WholeFileCache:
    """The whole-file cache of one mount. Build it with `open_whole_file_cache`."""

    def __init__(
        self,
        storage: StorageClient,
        config: WholeFileConfig,
        location: str,
        layout: CacheLayout,
        alloc_unit: int,
        nursery: trio.Nursery,
    ) -> None:
        self.config = config
        self.location = location
        self.layout = layout
        self._storage = storage
        self._alloc_unit = alloc_unit
        self._nursery = nursery
        self.pruner = Pruner(
            layout,
            PrunerConfig(config.space, rescan_interval_s=config.rescan_interval_s),
            keep=self._in_use,
        )
        slots = max(1, config.download_slots)
        self._transfers = Transfers(
            storage,
            None,
            # no early writeback: nothing here waits for the disk (see start_writeback)
            TransferConfig(part_size=config.part_size, verify=True, start_writeback=False),
            slots=trio.CapacityLimiter(slots),
            threads=trio.CapacityLimiter(slots),
        )
        self._io_limiter = trio.CapacityLimiter(slots)
        #: worker threads reading local copies for FUSE reads
        self.read_limiter = trio.CapacityLimiter(READ_THREADS)
        self._open: dict[Path, LocalCopy] = {}
        self._downloads: dict[Path, _Download] = {}
        #: entries that must not be pruned: open, or being downloaded and not yet open
        self._pinned: set[Path] = set()
        #: entries whose Content-MD5 this process has checked
        self._verified: set[Path] = set()
        self._latest_etag: LRUCache[str, str] = LRUCache(REMEMBERED_VERSIONS)
        self._fallback_logged: set[str] = set()
        self._cached_opens = 0
        self._shared_opens = 0
        self._downloads_done = 0
        self._downloaded_bytes = 0
        self._failed = 0
        self._fallbacks = 0
        self._corrupt = 0
        #: bytes handed to readers (WholeFileReader adds to it)
        self.served_bytes = 0

    def path(self, version: BlobVersion) -> Path:
        return self.layout.entry_path(KIND, self.location, (version.name, version.etag))

    def _in_use(self, path: Path) -> bool:
        # called by the pruner from a worker thread; set membership is atomic under the GIL
        return Path(path) in self._pinned

    # -- open / close ------------------------------------------------------------------------

    async def open(self, version: BlobVersion) -> LocalCopy | None:
        """The local copy of `version`, downloading it first if needed (one download for all
        opens of a version). None if it cannot fit in the cache (stream it instead). Close it
        with `release`.

        Raises StorageError (after the storage client's retries), TransferError (wrong bytes)
        or OSError (the cache directory failed); nothing partial is left behind.
        """
        path = self.path(version)
        while True:
            copy = self._open.get(path)
            if copy is not None:
                copy.users += 1
                self._cached_opens += 1
                return copy
            download = self._downloads.get(path)
            if download is None:
                copy = await self._open_from_disk(version, path)
                if copy is not None:
                    self._cached_opens += 1
                    return copy
                if path in self._open or path in self._downloads:
                    continue  # another open got there while we looked
                download = self._start_download(version, path)
            else:
                self._shared_opens += 1
            copy = await self._wait(download)
            if copy is not None or not download.fits:
                return copy
            # the download was abandoned by everyone else just before we came: start again

    def release(self, copy: LocalCopy) -> None:
        """One handle on `copy` closed; the last one closes its fd (the entry may be pruned)."""
        copy.users -= 1
        if copy.users <= 0 and self._open.get(copy.path) is copy:
            del self._open[copy.path]
            self._unpin_if_idle(copy.path)
            with contextlib.suppress(OSError):
                os.close(copy.fd)

    async def _wait(self, download: _Download) -> LocalCopy | None:
        """Wait for a download: its copy (one use of it is ours), or None if the file does not
        fit or the download was abandoned. Re-raises its failure."""
        download.waiters += 1
        try:
            await download.done.wait()
        finally:
            download.waiters -= 1
            if download.waiters == 0 and not download.done.is_set():
                download.scope.cancel()  # nobody wants it any more
        # No checkpoint from here to the caller's handle: a waiter woken by `done` always
        # takes the use the download counted for it.
        if download.error is not None:
            raise download.error
        return download.copy

    def _unpin_if_idle(self, path: Path) -> None:
        if path not in self._open and path not in self._downloads:
            self._pinned.discard(path)

    # -- an entry already on disk --------------------------------------------------------------

    async def _open_from_disk(self, version: BlobVersion, path: Path) -> LocalCopy | None:
        self._pinned.add(path)
        copy = None
        try:
            fd = await trio.to_thread.run_sync(_open_touched, path, limiter=self._io_limiter)
            if fd is None:
                return None
            try:
                ok = await self._verify(version, path, fd)
            except BaseException:
                os.close(fd)
                raise
            if not ok:
                os.close(fd)
                self._corrupt += 1
                log.warning(
                    "whole-file cache: the copy of %s failed verification; downloading it again",
                    version.name,
                )
                await self._remove(path)
                return None
            self._verified.add(path)
            copy = self._register(path, fd, version, users=1)
            return copy
        finally:
            if copy is None:
                self._unpin_if_idle(path)

    async def _verify(self, version: BlobVersion, path: Path, fd: int) -> bool:
        """Size always; Content-MD5 (when the blob has one) once per entry and process."""
        if os.fstat(fd).st_size != version.size:
            return False
        if path in self._verified:
            return True
        props = await self._storage.get_properties(version.name)
        if props.etag != version.etag or props.content_md5 is None:
            return True
        digest = await trio.to_thread.run_sync(_md5_of, fd, limiter=self._io_limiter)
        return hmac.compare_digest(digest, props.content_md5)

    def _register(self, path: Path, fd: int, version: BlobVersion, *, users: int) -> LocalCopy:
        copy = self._open.get(path)
        if copy is not None:  # opened twice at once; keep one fd
            os.close(fd)
        else:
            copy = self._open[path] = LocalCopy(path, fd, version.size)
            self._pinned.add(path)
        copy.users += users
        self._note_latest(version)
        return copy

    async def _remove(self, path: Path) -> None:
        freed = await trio.to_thread.run_sync(_unlink, path, limiter=self._io_limiter)
        if freed:
            self.pruner.budget.removed(freed)

    def _note_latest(self, version: BlobVersion) -> None:
        """Remember the version; the copy of the version it replaces goes (unless open)."""
        previous = self._latest_etag.get(version.name)
        self._latest_etag[version.name] = version.etag
        if previous is None or previous == version.etag:
            return
        old = self.path(BlobVersion(version.name, previous, 0))
        if old not in self._pinned:
            self._nursery.start_soon(self._remove, old)

    # -- downloading ---------------------------------------------------------------------------

    def _start_download(self, version: BlobVersion, path: Path) -> _Download:
        download = self._downloads[path] = _Download()
        self._pinned.add(path)
        self._nursery.start_soon(self._run_download, version, path, download)
        return download

    async def _run_download(self, version: BlobVersion, path: Path, download: _Download) -> None:
        try:
            with download.scope:
                fd = await self._download(version, path)
                self._verified.add(path)
                # one use for each open waiting now; each of them takes it without a checkpoint
                download.copy = self._register(path, fd, version, users=download.waiters)
        except _DoesNotFit:
            download.fits = False
        except OSError as exc:
            # the cache directory failed (full disk, I/O error): storage is still fine
            download.fits = False
            self._fallbacks += 1
            log.warning(
                "whole-file cache: cannot cache %s (%s); streaming it in block mode instead",
                version.name,
                exc,
            )
        except Exception as exc:
            download.error = exc
            self._failed += 1
            log.warning("whole-file cache: download of %s failed: %s", version.name, exc)
        finally:
            del self._downloads[path]
            copy = download.copy
            if copy is not None and copy.users <= 0:
                self.release(copy)  # every open gave up before it finished
                download.copy = None
            self._unpin_if_idle(path)
            download.done.set()

    async def _download(self, version: BlobVersion, path: Path) -> int:
        """Download `version` to `path`; the open fd of the finished file."""
        started = trio.current_time()
        props = await self._storage.get_properties(version.name)
        if props.etag != version.etag:
            raise BlobChanged(f"{version.name} changed while being opened; open it again")
        size = props.size
        estimate = allocated_size(size, self._alloc_unit)
        if not await self._make_room(version.name, estimate):
            raise _DoesNotFit
        self.pruner.begin_write(path, estimate)
        written = 0
        free: int | None = None
        try:
            blob = BlobProps(
                version.name, size, version.etag, props.last_modified, props.content_md5
            )
            await trio.to_thread.run_sync(_make_folder, path.parent, limiter=self._io_limiter)
            await self._transfers.fetch_to(blob, path, temporary_path(path), lambda n: None)
            fd, written, free = await trio.to_thread.run_sync(
                _open_after_download, path, limiter=self._io_limiter
            )
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                self.pruner.report_full(os.strerror(exc.errno), disk_says_so=True)
            raise
        finally:
            self.pruner.end_write(path, estimate, written, free)
        self._downloads_done += 1
        self._downloaded_bytes += size
        elapsed = trio.current_time() - started
        log.info(
            "whole-file cache: downloaded %s (%s) in %.2fs",
            version.name,
            format_size(size),
            elapsed,
        )
        return fd

    async def _make_room(self, name: str, estimate: int) -> bool:
        await self.pruner.ready.wait()
        capacity = self.pruner.budget.capacity()
        # larger than the whole cache: pruning everything would not help, so do not try
        if estimate <= capacity and await self.pruner.make_room(estimate):
            return True
        self._fallbacks += 1
        if name not in self._fallback_logged and len(self._fallback_logged) < 10_000:
            self._fallback_logged.add(name)
            log.warning(
                "whole-file cache: %s (%s) does not fit in %s (may use %s); streaming it in "
                "block mode instead",
                name,
                format_size(estimate),
                self.layout.root,
                format_size(capacity),
            )
        return False

    def close_all(self) -> None:
        """Close every open copy's fd (at unmount, when no handle can read any more)."""
        for copy in list(self._open.values()):
            copy.users = 0
            self.release(copy)

    def statistics(self) -> WholeFileStats:
        return WholeFileStats(
            cache_dir=str(self.layout.root),
            served_bytes=self.served_bytes,
            cached_opens=self._cached_opens,
            shared_opens=self._shared_opens,
            downloads=self._downloads_done,
            downloaded_bytes=self._downloaded_bytes,
            failed_downloads=self._failed,
            fallbacks=self._fallbacks,
            corrupt=self._corrupt,
            open_copies=len(self._open),
            space=self.pruner.statistics(),
        )


# -- blocking helpers (worker threads) ---------------------------------------------------------


def _open_touched(path: Path) -> int | None:
    """Open an entry for reading and mark it used now (its mtime is its LRU time)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with contextlib.suppress(OSError):
        os.utime(fd)
    return fd


def _open_after_download(path: Path) -> tuple[int, int, int]:
    """(fd, allocated bytes, free bytes on the disk) of a just-downloaded entry."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        os.utime(fd)  # the download set the blob's mtime; the cache orders by last use
    st = os.fstat(fd)
    return fd, allocated_bytes(st), free_bytes(path.parent)[0]


def _make_folder(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def _md5_of(fd: int) -> bytes:
    digest = hashlib.md5()
    offset = 0
    while chunk := os.pread(fd, _HASH_CHUNK, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.digest()


def _unlink(path: Path) -> int:
    """Remove an entry; the bytes it occupied (0 if it was not there)."""
    try:
        size = allocated_bytes(os.stat(path))
        os.unlink(path)
    except FileNotFoundError:
        return 0
    return size


# -- lifetime ----------------------------------------------------------------------------------


@asynccontextmanager
async def open_whole_file_cache(
    storage: StorageClient, config: WholeFileConfig, location: str
) -> AsyncIterator[WholeFileCache | None]:
    """The whole-file cache of a mount of `location`, its pruner running; None when the cache
    directory cannot be used (logged: every open then streams in block mode)."""
    if config.space.cache_size == 0:
        log.warning("whole-file mode with DATASET_MOUNT_CACHE_SIZE=0: every file is streamed")
        yield None
        return
    async with using_cache_dir(config.root, KIND, location) as cache_dir:
        if cache_dir is None:
            log.warning("whole-file cache off: every file is streamed")
            yield None
            return
        log.info("whole-file mode: cache %s for %s", config.root, location)
        async with background_tasks() as nursery:
            cache = WholeFileCache(
                storage, config, location, cache_dir.layout, cache_dir.alloc_unit, nursery
            )
            nursery.start_soon(cache.pruner.run)
            try:
                yield cache
            finally:
                # downloads in progress remove their temporaries as they are cancelled
                nursery.cancel_scope.cancel()
                cache.close_all()
