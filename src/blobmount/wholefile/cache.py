"""Whole-file open mode: an opened blob version is downloaded whole into the cache directory,
and every read of it is then served from that local copy.

Entries live under the cache directory's ``files/`` kind (see `cachedir.layout`): the entry name
is a hash of (blob name, ETag), so a new version of a blob is a new entry and an entry's bytes
never change. A file under its final name is always a whole, verified version: it is written to
an unnamed file (or a temporary name) and named only once whole, after its bytes matched the
blob's Content-MD5 when it has one (`entries`).

An open that downloads costs one storage request per part and nothing else (`wholefile.fetch`):
the first GET's answer, pinned to the version, also gives the blob's size and Content-MD5. Three
sizes, three paths:

- up to `MEMORY_MAX_BYTES` (and one part): one GET into memory, in the task of the open that
  starts it, checked, and the opens waiting for it are answered at once from those bytes; only
  then is the entry written and named, by the writer (`writer`: on the trio thread while the
  disk answers fast, else in a thread of its own). The transfer slot is held until the write
  lands, so bytes waiting for the disk stay within `download_slots * MEMORY_MAX_BYTES`; the
  write runs even at unmount (it is short), so a file read once is cached.
- up to `part_size`: one GET, written to the entry in a worker thread before the open returns.
- bigger: parts fetched concurrently into a temporary file, renamed once whole and checked
  (`fetch.fetch_parts`).

A cached open (a copy already open, or its entry on disk) makes no request: the entry is opened
on the trio thread while the disk answers fast. A cold open does not look on disk at all when
the entry is certainly not there (`presence`).

Sharing: opens of the same version share one `LocalCopy` while any of them is open or its entry
is being written, and wait on one download while it runs. A small version's download (into
memory) runs in the task of the open that starts it, so a cold open of a small file starts no
task of its own; if that open is interrupted, its GET stops, and one of the opens that joined
it starts another, for them all. A bigger version's download runs in the cache's own nursery,
so an open that is interrupted does not abort it for the others; when the last waiting open
gives up, it is cancelled (and its temporary removed). Either way, an abandoned download leaves
nothing behind: no entry, no temporary, its room and its transfer slot given back.

Several processes (DATASET_MOUNT_WORKER_PROCESSES): each process has its own cache object over
the one folder; a version is still downloaded once for the mount, and an entry one process
wrote is found by the others without a check (`multiproc.whole_file_copies`).

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
import hmac
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import trio
from cachetools import LRUCache

from blobmount.blocks.inline_reads import INLINE_MAX_BYTES, InlineReadGate, InlineReadStats
from blobmount.blocks.keys import BlobVersion
from blobmount.cachedir.layout import CacheLayout, entry_file, temporary_name
from blobmount.cachedir.pruner import Pruner, PrunerConfig, PrunerStats
from blobmount.cachedir.session import background_tasks, using_cache_dir
from blobmount.cachedir.shared_budget import SharedBudgetCounters
from blobmount.cachedir.space import SpaceConfig, allocated_size
from blobmount.claims import Claim
from blobmount.download_mode.transfer import DEFAULT_PART_SIZE
from blobmount.multiproc.whole_file_copies import SiblingCopies
from blobmount.storage.base import StorageClient
from blobmount.units import format_size
from blobmount.wholefile import entries
from blobmount.wholefile.fetch import fetch_parts, fetch_whole
from blobmount.wholefile.presence import PresenceFilter, scan_folder
from blobmount.wholefile.writer import EntryWrite, EntryWriter

log = logging.getLogger(__name__)

T = TypeVar("T")

KIND = "files"
#: blob names whose last cached ETag is remembered (to remove a replaced version's copy)
REMEMBERED_VERSIONS = 100_000
#: reads of local copies in worker threads at once (page-cache hits take microseconds, so this
#: only bounds threads stuck waiting for the disk)
READ_THREADS = 16
#: a version up to this size (and one part) is served from memory while its entry is written
MEMORY_MAX_BYTES = INLINE_MAX_BYTES
#: at most this many failed background writes are logged as warnings (then at debug level)
_WRITE_FAILURES_LOGGED = 10


@dataclass(frozen=True, slots=True)
class WholeFileConfig:
    root: Path
    space: SpaceConfig
    #: ranged GETs in flight across all downloads (DATASET_MOUNT_READ_THREADS)
    download_slots: int
    #: a version up to this size is one GET, served from memory while its entry is written
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
    #: copies opened from an entry another process of the mount downloaded (several processes)
    other_process_copies: int
    space: PrunerStats
    #: entry opens and small entries' writes done on the trio thread (and the times the disk
    #: was found slow, which sends them to threads for a while)
    in_place: InlineReadStats
    #: small entries written by the writer's thread (the disk was slow, or at unmount)
    thread_writes: int
    #: opens of small files whose bytes went into the kernel's page cache with the open
    preloaded_opens: int


class LocalCopy:
    """One cached blob version, open for reading, shared by the handles open on it.

    A version fetched into memory is read from `data` while it is open (`fd` is -1); one found
    on disk or downloaded in parts is read through `fd`.
    """

    __slots__ = ("data", "fd", "path", "size", "users", "writing")

    def __init__(self, path: str, fd: int, size: int, data: bytes | None = None) -> None:
        self.path = path
        self.fd = fd
        self.size = size
        self.data = data
        self.users = 0
        #: its entry is being written in the background
        self.writing = False


class _Download:
    """A download in progress, and the opens waiting for it (`waiters`, each owed one use of
    its copy). A small version's runs in the task of the open that started it, counted among
    the waiters; a bigger one's runs in the cache's nursery under `scope`, cancelled when the
    last waiter gives up."""

    __slots__ = ("claimed", "copy", "done", "error", "fits", "scope", "waiters")

    def __init__(self, scope: trio.CancelScope | None) -> None:
        self.done = trio.Event()
        self.scope = scope
        self.copy: LocalCopy | None = None
        self.error: Exception | None = None
        self.fits = True
        self.waiters = 0
        #: this process holds the version's claim (several processes: `siblings`)
        self.claimed = False


def _outcome(download: _Download) -> LocalCopy | None:
    """What an open waiting on a finished download gets: its copy, or None if the file does
    not fit or the download was abandoned; its failure is raised."""
    if download.error is not None:
        raise download.error
    return download.copy


class _DoesNotFit(Exception):
    pass


@dataclass(slots=True)
class _PendingWrite:
    """A copy fetched into memory whose entry the writer is writing, and what that holds: the
    bytes reserved for it in the cache and its transfer slot."""

    copy: LocalCopy
    version: BlobVersion
    estimate: int
    slot: object
    #: the version's claim is held until the entry is written (several processes)
    claimed: bool = False


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
        *,
        shared_budget: SharedBudgetCounters | None = None,
        siblings: SiblingCopies | None = None,
    ) -> None:
        self.config = config
        #: the other processes' downloads and entries (a multi-process mount)
        self._siblings = siblings
        self.location = location
        self.layout = layout
        self._storage = storage
        self._alloc_unit = alloc_unit
        #: the location's folder (its name is a hash: computed once, not at every open), as a
        #: string: entry paths are built and hashed at every open, and pathlib costs microseconds
        self._folder = os.fspath(layout.location_dir(KIND, location))
        self._nursery = nursery
        self.pruner = Pruner(
            layout,
            PrunerConfig(config.space, rescan_interval_s=config.rescan_interval_s),
            keep=self._in_use,
            shared_budget=shared_budget,
        )
        slots = max(1, config.download_slots)
        #: GETs in flight, and fetched bytes not yet written (see the module docstring)
        self._slots = trio.CapacityLimiter(slots)
        self._io_limiter = trio.CapacityLimiter(slots)
        #: worker threads reading local copies for FUSE reads
        self.read_limiter = trio.CapacityLimiter(READ_THREADS)
        #: whether an entry is opened on the trio thread (while the disk answers fast)
        self._in_place = InlineReadGate()
        #: versions up to this size are fetched into memory and served from there at once
        self._memory_max = min(MEMORY_MAX_BYTES, config.part_size)
        #: which entries may be on disk (`presence`): a cold open skips looking
        self._present = PresenceFilter()
        #: writes the entries of copies fetched into memory (its `run` is the cache's task)
        #: small entries are written in place while the disk answers fast: one gate judges the
        #: disk for the entry opens and writes alike
        self.writer = EntryWriter(self._write_landed, self._in_place)
        # each keyed by the entry's path (`path`)
        self._writes: dict[str, EntryWrite] = {}
        self._open: dict[str, LocalCopy] = {}
        self._downloads: dict[str, _Download] = {}
        #: entries that must not be pruned: open, or being downloaded and not yet open
        self._pinned: set[str] = set()
        #: entries whose Content-MD5 this process has checked (or wrote from checked bytes)
        self._verified: set[str] = set()
        self._latest_etag: LRUCache[str, str] = LRUCache(REMEMBERED_VERSIONS)
        self._fallback_logged: set[str] = set()
        self._cached_opens = 0
        self._shared_opens = 0
        self._downloads_done = 0
        self._downloaded_bytes = 0
        self._failed = 0
        self._fallbacks = 0
        self._corrupt = 0
        self._other_process_copies = 0
        self._write_failures = 0
        #: bytes handed to readers (WholeFileReader adds to it)
        self.served_bytes = 0
        #: opens whose bytes went into the kernel's page cache with the open (WholeFileReader)
        self.preloaded = 0

    def path(self, version: BlobVersion) -> str:
        """The path of `version`'s entry: the key of the cache's tables."""
        return entry_file(self._folder, (version.name, version.etag))

    def _in_use(self, path: Path) -> bool:
        # called by the pruner from a worker thread; set membership is atomic under the GIL.
        # The pruner's paths and ours are both built from the layout's root: the same strings.
        return os.fspath(path) in self._pinned

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._io_limiter)

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
                if version.size <= self._memory_max:
                    return await self._download_here(version, path)
                download = self._start_download(version, path)
            else:
                self._shared_opens += 1
            copy = await self._wait(download)
            if copy is not None or not download.fits:
                return copy
            # the download was abandoned by everyone else just before we came, or the open
            # running it was interrupted: start again

    def release(self, copy: LocalCopy) -> None:
        """One handle on `copy` closed; the last one closes its fd (the entry may be pruned),
        unless its entry is still being written (the write then closes it)."""
        copy.users -= 1
        if copy.users <= 0 and not copy.writing:
            self._drop(copy)

    def _drop(self, copy: LocalCopy) -> None:
        if self._open.get(copy.path) is copy:
            del self._open[copy.path]
            self._unpin_if_idle(copy.path)
        copy.data = None
        fd, copy.fd = copy.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    async def _wait(self, download: _Download) -> LocalCopy | None:
        """Wait for a download: its copy (one use of it is ours), or None if the file does not
        fit or the download was abandoned. Re-raises its failure."""
        download.waiters += 1
        try:
            await download.done.wait()
        finally:
            download.waiters -= 1
            scope = download.scope
            if download.waiters == 0 and scope is not None and not download.done.is_set():
                scope.cancel()  # nobody wants it any more
        # No checkpoint from here to the caller's handle: a waiter woken by `done` always
        # takes the use the download counted for it.
        return _outcome(download)

    def _unpin_if_idle(self, path: str) -> None:
        if path not in self._open and path not in self._downloads:
            self._pinned.discard(path)

    # -- an entry already on disk --------------------------------------------------------------

    async def learn_present(self) -> None:
        """Scan the location's folder once for entries of earlier mounts (`presence`)."""
        folder = self._folder
        try:
            found = await trio.to_thread.run_sync(scan_folder, folder, limiter=self._io_limiter)
        except OSError as exc:
            log.warning("whole-file cache: cannot list %s (%s); every open looks", folder, exc)
            return
        self._present.merge(found)

    async def _open_from_disk(self, version: BlobVersion, path: str) -> LocalCopy | None:
        # an entry another process of the mount wrote is not in this process's filter
        by_sibling = self._written_by_sibling(path)
        if not by_sibling and not self._present.may_hold(os.path.basename(path)):
            return None  # never cached: no need to look
        self._pinned.add(path)
        copy = None
        try:
            found = await self._open_entry(path)
            if found is None:
                return None
            fd, size = found
            if by_sibling:
                self._verified.add(path)  # written from checked bytes; its size is checked
            try:
                ok = await self._verify(version, path, fd, size)
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
            self._present.add(os.path.basename(path))
            if by_sibling:
                self._other_process_copies += 1  # counted once its size was found right
            copy = self._register(path, fd, version, users=1)
            return copy
        finally:
            if copy is None:
                self._unpin_if_idle(path)

    def _written_by_sibling(self, path: str) -> bool:
        siblings = self._siblings
        if siblings is None or path in self._verified:
            return False
        return siblings.wrote(os.path.basename(path))

    async def _open_entry(self, path: str) -> tuple[int, int] | None:
        """`entries.open_entry`, on the trio thread while the disk answers fast."""
        gate = self._in_place
        if not gate.allows(0):
            return await trio.to_thread.run_sync(
                entries.open_entry, path, limiter=self.read_limiter
            )
        started = time.monotonic()
        try:
            return entries.open_entry(path)
        finally:
            gate.record(time.monotonic() - started)

    async def _verify(self, version: BlobVersion, path: str, fd: int, size: int) -> bool:
        """Size always; Content-MD5 (when the blob has one) once per entry and process."""
        if size != version.size:
            return False
        if path in self._verified:
            return True
        props = await self._storage.get_properties(version.name)
        if props.etag != version.etag or props.content_md5 is None:
            return True
        digest = await self._in_thread(entries.md5_of, fd)
        return hmac.compare_digest(digest, props.content_md5)

    def _register(self, path: str, fd: int, version: BlobVersion, *, users: int) -> LocalCopy:
        copy = self._open.get(path)
        if copy is not None:  # opened twice at once; keep one fd
            os.close(fd)
        else:
            copy = self._open[path] = LocalCopy(path, fd, version.size)
            self._pinned.add(path)
        copy.users += users
        self._note_latest(version)
        return copy

    async def _remove(self, path: str) -> None:
        freed = await self._in_thread(entries.unlink, path)
        if freed:
            self.pruner.budget.removed(freed)

    def _note_latest(self, version: BlobVersion) -> None:
        """Remember the version; the copy of the version it replaces goes (unless open)."""
        previous = self._latest_etag.get(version.name)
        self._latest_etag[version.name] = version.etag
        if previous is None or previous == version.etag:
            return
        old = self.path(BlobVersion(version.name, previous, 0))
        write = self._writes.get(old)
        if write is not None and isinstance(write.owner, _PendingWrite):
            if write.owner.copy.users <= 0:
                write.cancelled = True  # not written if not started; removed if it was
        elif old not in self._pinned:
            self._nursery.start_soon(self._remove, old)

    # -- downloading ---------------------------------------------------------------------------

    def _new_download(self, path: str, scope: trio.CancelScope | None) -> _Download:
        download = self._downloads[path] = _Download(scope)
        self._pinned.add(path)
        return download

    async def _download_here(self, version: BlobVersion, path: str) -> LocalCopy | None:
        """Download a small version in this open's task, the opens that come meanwhile joining
        it (`_wait`): its copy (one use of it is ours), or None if it does not fit. Re-raises
        its failure. Interrupted, it stops; the opens that joined it start again (`open`)."""
        download = self._new_download(path, None)
        download.waiters = 1  # this open: the copy counts its use as it does the joiners'
        try:
            await self._run_download(version, path, download)
        finally:
            download.waiters -= 1
        # no checkpoint from `_run_download`'s end to the caller's handle: the use is ours
        return _outcome(download)

    def _start_download(self, version: BlobVersion, path: str) -> _Download:
        """Download a bigger version in the cache's nursery, for the opens that `_wait`."""
        scope = trio.CancelScope()
        download = self._new_download(path, scope)
        self._nursery.start_soon(self._run_download_in, scope, version, path, download)
        return download

    async def _run_download_in(
        self, scope: trio.CancelScope, version: BlobVersion, path: str, download: _Download
    ) -> None:
        with scope:
            await self._run_download(version, path, download)

    async def _run_download(self, version: BlobVersion, path: str, download: _Download) -> None:
        """Run `download` to its end, its outcome recorded for the opens waiting on it; however
        it ends (cancelled too), it is unregistered, its claim ended, and `done` set."""
        try:
            if self._siblings is not None:
                # another process of the mount may be downloading it: its copy, if so
                download.copy = await self._claim_or_wait(version, path, download)
            if download.copy is None:
                download.copy = await self._download(version, path, download)
                self._downloads_done += 1
                self._downloaded_bytes += version.size
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
            self._release_claim(download, path, written=False)
            del self._downloads[path]
            copy = download.copy
            if copy is not None and copy.users <= 0:
                self.release(copy)  # every open gave up before it finished
                download.copy = None
            self._unpin_if_idle(path)
            download.done.set()

    async def _download(self, version: BlobVersion, path: str, download: _Download) -> LocalCopy:
        """Fetch `version`: its copy, with one use for each open waiting now (each takes it
        without a checkpoint)."""
        if version.size <= self._memory_max:
            return await self._fetch_into_memory(version, path, download)
        if version.size <= self.config.part_size:
            fd = await self._fetch_whole_to_disk(version, path)
        else:
            fd = await self._fetch_to_disk(version, path)
        self._verified.add(path)
        self._present.add(os.path.basename(path))
        self._release_claim(download, path, written=True)
        return self._register(path, fd, version, users=download.waiters)

    async def _claim_or_wait(
        self, version: BlobVersion, path: str, download: _Download
    ) -> LocalCopy | None:
        """(several processes) Claim the download of `version` for this process (None), or
        wait for the process that claimed it and open the entry it wrote: that copy, with one
        use for each open waiting now. A claimer that ends without the entry (its download
        failed, or its process died) leaves the download to this process."""
        assert self._siblings is not None
        siblings, entry = self._siblings, os.path.basename(path)
        while True:
            claim = siblings.claim(entry)
            if claim is not Claim.THEIRS:
                download.claimed = claim is Claim.OURS
                return None
            if not await siblings.wait(entry):
                continue  # claimed again: by us, or by another waiter
            found = await self._open_entry(path)
            if found is None:
                continue  # pruned already
            fd, size = found
            if size != version.size:
                os.close(fd)
                continue  # not this version's bytes after all: download it here
            self._other_process_copies += 1
            self._verified.add(path)  # written by the mount from checked bytes
            self._present.add(entry)
            # no checkpoint from here to `done`: each open waiting now takes its use
            return self._register(path, fd, version, users=download.waiters)

    def _release_claim(
        self, download: _Download | _PendingWrite, path: str, *, written: bool
    ) -> None:
        """End the version's claim, if this process holds it; `written`: its entry is on disk
        under its final name, written from checked bytes (recorded first, for the waiters)."""
        if not download.claimed:
            return
        assert self._siblings is not None
        download.claimed = False
        entry = os.path.basename(path)
        if written:
            self._siblings.record(entry)
        self._siblings.release(entry)

    async def _reserve(self, version: BlobVersion, path: str) -> tuple[int, object]:
        """Room for `version`'s entry and a transfer slot: (the bytes reserved, the slot's
        borrower). Raises _DoesNotFit; undo with `_unreserve`."""
        estimate = allocated_size(version.size, self._alloc_unit)
        if not await self._make_room(version.name, estimate):
            raise _DoesNotFit
        self.pruner.begin_write(path, estimate)
        slot = object()
        try:
            await self._slots.acquire_on_behalf_of(slot)
        except BaseException:
            self.pruner.end_write(path, estimate, 0, None)
            raise
        return estimate, slot

    def _unreserve(
        self, path: str, estimate: int, slot: object, written: int = 0, free: int | None = None
    ) -> None:
        self._slots.release_on_behalf_of(slot)
        self.pruner.end_write(path, estimate, written, free)

    async def _fetch_into_memory(
        self, version: BlobVersion, path: str, download: _Download
    ) -> LocalCopy:
        """One GET of a small version, checked against its Content-MD5, whose copy is then
        served from memory at once; the writer writes its entry meanwhile (`_write_landed`
        gives back the room and the slot taken here)."""
        # A download that waits for a transfer slot counts as a fetch for the writer: the
        # slots may all be held by copies whose entries wait to be written behind a fetch, and
        # this is the fetch they wait for (without it, every slot's worth of small files waited
        # MAX_DEFER_S: 150 files/s with 8 or more readers of a source that answers at once)
        with self.writer.fetching():
            estimate, slot = await self._reserve(version, path)
            try:
                # checked before any open gets the bytes: a reader never sees unverified data
                data, _ = await fetch_whole(self._storage, version, self._in_thread)
            except BaseException:
                self._unreserve(path, estimate, slot)
                raise
        # No checkpoint from here to `done`: each open waiting now takes one use of the copy.
        found = self._open.get(path)
        if found is not None:
            # another process wrote the entry meanwhile, and an open found it: use that copy
            self._unreserve(path, estimate, slot)
            found.users += download.waiters
            return found
        copy = self._open[path] = LocalCopy(path, -1, version.size, data)
        self._pinned.add(path)
        copy.users = download.waiters
        copy.writing = True
        self._note_latest(version)
        write = EntryWrite(path, data)  # checked above
        write.owner = _PendingWrite(copy, version, estimate, slot, download.claimed)
        download.claimed = False  # ended by the write (`_write_landed`)
        self._writes[path] = write
        self.writer.submit(write)
        return copy

    def _write_landed(self, write: EntryWrite) -> None:
        """(trio thread) The writer is done with a copy's entry: written, or not."""
        pending = write.owner
        assert isinstance(pending, _PendingWrite)
        copy, version = pending.copy, pending.version
        if self._writes.get(copy.path) is write:
            del self._writes[copy.path]
        written = pending.estimate if write.outcome == "written" else 0
        self._unreserve(copy.path, pending.estimate, pending.slot, written, None)
        self._release_claim(pending, copy.path, written=write.outcome == "written")
        copy.writing = False
        if write.outcome == "written":
            self._verified.add(copy.path)  # written from checked bytes
            self._present.add(os.path.basename(copy.path))
            if self._latest_etag.get(version.name) != version.etag and copy.users <= 0:
                self._nursery.start_soon(self._remove, copy.path)  # replaced meanwhile
        elif write.outcome == "failed":
            exc = write.error
            if exc is not None and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                self.pruner.report_full(os.strerror(exc.errno), disk_says_so=True)
            self._write_failures += 1
            quiet = self._write_failures > _WRITE_FAILURES_LOGGED
            log.log(
                logging.DEBUG if quiet else logging.WARNING,
                "whole-file cache: cannot write the copy of %s (%s); it is served from memory "
                "while open, and downloaded again by a later open",
                version.name,
                exc,
            )
        if copy.users <= 0:
            self._drop(copy)

    async def _fetch_whole_to_disk(self, version: BlobVersion, path: str) -> int:
        """One GET of a version up to one part, written to its entry before the open returns
        (too big to hold in memory while the write waits); the open fd of the entry."""
        estimate, slot = await self._reserve(version, path)
        written = 0
        free: int | None = None
        try:
            with self.writer.fetching():
                data, _ = await fetch_whole(self._storage, version, self._in_thread)
            fd, written, free = await self._in_thread(entries.write_entry, path, data)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                self.pruner.report_full(os.strerror(exc.errno), disk_says_so=True)
            raise
        finally:
            self._unreserve(path, estimate, slot, written, free)
        return fd

    async def _fetch_to_disk(self, version: BlobVersion, path: str) -> int:
        """Fetch a version bigger than one part into its entry; the open fd of the entry."""
        size = version.size
        estimate = allocated_size(size, self._alloc_unit)
        if not await self._make_room(version.name, estimate):
            raise _DoesNotFit
        self.pruner.begin_write(path, estimate)
        written = 0
        free: int | None = None
        try:
            await self._in_thread(entries.make_folder, os.path.dirname(path))
            with self.writer.fetching():
                await fetch_parts(
                    self._storage,
                    version,
                    Path(path),
                    Path(temporary_name(path)),
                    part_size=self.config.part_size,
                    slots=self._slots,
                    run=self._in_thread,
                )
            fd, written, free = await self._in_thread(entries.open_after_download, path)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                self.pruner.report_full(os.strerror(exc.errno), disk_says_so=True)
            raise
        finally:
            self.pruner.end_write(path, estimate, written, free)
        log.info("whole-file cache: downloaded %s (%s)", version.name, format_size(size))
        return fd

    async def _make_room(self, name: str, estimate: int) -> bool:
        await self.pruner.ready.wait()
        capacity = self.pruner.budget.capacity()
        # larger than the whole cache: pruning everything would not help, so do not try
        if estimate <= capacity and await self.pruner.make_room(estimate):
            return True
        # Writes in flight hold room that no pass can free until their entries are on disk
        # (and the budget then counts them as they are): let them land, and look again.
        await self.writer.settled()
        capacity = self.pruner.budget.capacity()
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
        """Close every open copy's fd (at unmount, when no handle can read any more); a copy
        whose entry is still being written is closed by its write as it ends."""
        for copy in list(self._open.values()):
            copy.users = 0
            if not copy.writing:
                self._drop(copy)

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
            # a copy whose entry is still being written, but that nobody has open, is not open
            open_copies=sum(1 for copy in self._open.values() if copy.users > 0),
            other_process_copies=self._other_process_copies,
            space=self.pruner.statistics(),
            in_place=self._in_place.statistics(),
            thread_writes=self.writer.written_in_thread,
            preloaded_opens=self.preloaded,
        )


# -- lifetime ----------------------------------------------------------------------------------


@asynccontextmanager
async def open_whole_file_cache(
    storage: StorageClient,
    config: WholeFileConfig,
    location: str,
    *,
    shared_budget: SharedBudgetCounters | None = None,
    siblings: SiblingCopies | None = None,
) -> AsyncIterator[WholeFileCache | None]:
    """The whole-file cache of a mount of `location`, its pruner running; None when the cache
    directory cannot be used (logged: every open then streams in block mode). `shared_budget`
    and `siblings`: the space figures and the downloads shared by the processes of a
    multi-process mount."""
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
                storage,
                config,
                location,
                cache_dir.layout,
                cache_dir.alloc_unit,
                nursery,
                shared_budget=shared_budget,
                siblings=siblings,
            )
            nursery.start_soon(cache.pruner.run)
            nursery.start_soon(cache.writer.run)
            nursery.start_soon(cache.learn_present)
            try:
                yield cache
            finally:
                # downloads in progress remove their temporaries as they are cancelled
                nursery.cancel_scope.cancel()
                cache.close_all()
