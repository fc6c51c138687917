"""Downloader: copy every blob under a prefix to a local folder, resumably.

Tasks (one trio nursery):

    lister ──(bounded channel of Items)──► N workers ──► Transfers (slots: N GETs in flight)
       │ one listing page at a time,          │ fetch / make folder / check MD5
       │ classified in a thread               ▼
       └───────────────────────────────  pending manifest records ──► checkpoint task

- The prefix is listed flat (no delimiter), a page at a time, and transfers start while the
  listing continues. The channel holds at most one page of items, so the lister waits when the
  workers are behind: memory stays bounded for millions of blobs.
- N = RSLEX_DOWNLOADER_THREADS. The N workers each take one file at a time; every GET (a whole
  small file or one part of a big one) holds one of N shared slots until its bytes are
  written, so N bounds both the requests in flight and the data in memory.
- A failed blob is recorded (name and reason) and the others carry on. A blob whose ETag moves
  on during its download is fetched again at its new version; bytes that fail to check
  (short body, Content-MD5) are fetched once more. Refused names are failures too: the exit
  status says whether *everything* was copied.
- Checkpoints (every `checkpoint_interval_s`, and at the end, also when cancelled): syncfs the
  destination's file system, then save the records of the files completed before it, in one
  manifest transaction. So the manifest never names a file whose bytes a crash could lose,
  and a killed run loses at most the records since the last checkpoint (those files are
  fetched again).
- Cancellation (Ctrl-C, SIGTERM, a test's cancel scope) discards every temp file; completed
  files keep their final names, and the final checkpoint records them.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import trio

from blobmount.download_mode.direct_io import DirectWrites
from blobmount.download_mode.filters import NameFilter
from blobmount.download_mode.manifest import MANIFEST_NAME, Manifest, Record
from blobmount.download_mode.planner import Action, Item, Planner, source_id
from blobmount.download_mode.staging import Destination, file_md5
from blobmount.download_mode.transfer import (
    DEFAULT_PART_SIZE,
    TransferConfig,
    TransferError,
    Transfers,
)
from blobmount.errors import BlobChanged, StorageError
from blobmount.storage.base import MAX_LIST_PAGE, BlobProps, StorageClient

log = logging.getLogger(__name__)

T = TypeVar("T")

#: a blob is fetched at most this many times (ETag moved on, bytes failed to check)
MAX_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class DownloadConfig:
    dest: Path
    prefix: str = ""  # '' or ending in '/'
    transfers: int = 8  # RSLEX_DOWNLOADER_THREADS
    part_size: int = DEFAULT_PART_SIZE
    verify: bool = False
    includes: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    page_size: int = MAX_LIST_PAGE
    checkpoint_interval_s: float = 2.0
    #: failures kept with their reason (the count is always exact)
    max_failure_details: int = 1000
    write_in_thread: bool = True
    #: write large files around the page cache where the file system allows (direct_io)
    direct_io: bool = True
    #: where the manifest is kept (`manifest.manifest_path`); None: inside DEST
    manifest_path: Path | None = None

    def __post_init__(self) -> None:
        """Raises ValueError for values no download can run with."""
        if self.transfers < 1:
            raise ValueError(f"the number of transfers must be at least 1, not {self.transfers}")
        if self.part_size < 1:
            raise ValueError(f"the part size must be positive, not {self.part_size}")
        if self.prefix and not self.prefix.endswith("/"):
            raise ValueError(f"the prefix must be '' or end in '/', not {self.prefix!r}")
        NameFilter(self.includes, self.excludes)  # raises for an empty pattern


@dataclass(frozen=True, slots=True)
class Failure:
    blob: str
    reason: str


@dataclass(frozen=True, slots=True)
class DownloadStats:
    listed: int  # blobs listed so far
    listing_done: bool
    files_queued: int  # files to download (changed or missing locally)
    files_fetched: int  # downloaded and in place
    files_skipped: int  # already present and current
    folders: int  # folders made from marker blobs
    filtered: int  # left out by --include/--exclude
    failed: int  # blobs not copied (including refused names)
    bytes_queued: int  # bytes of the files to download
    bytes_received: int  # bytes written to temp files (includes attempts that failed)
    bytes_fetched: int  # bytes of the files downloaded
    bytes_skipped: int  # bytes of the files already current
    md5_verified: int  # files whose Content-MD5 was checked (fetched or already present)
    md5_missing: int  # files with --verify whose blob has no Content-MD5
    checkpoint_s: float  # time spent making files durable and saving the manifest
    bytes_direct: int  # of bytes_received, written around the page cache (O_DIRECT)
    elapsed_s: float


@dataclass(frozen=True, slots=True)
class DownloadResult:
    stats: DownloadStats
    failures: tuple[Failure, ...]  # the first `max_failure_details`
    #: why the download stopped before listing everything (e.g. the listing itself failed)
    fatal: str | None

    @property
    def ok(self) -> bool:
        return self.fatal is None and self.stats.failed == 0 and self.stats.listing_done


@dataclass(slots=True)
class _Counters:
    listed: int = 0
    listing_done: bool = False
    files_queued: int = 0
    files_fetched: int = 0
    files_skipped: int = 0
    folders: int = 0
    filtered: int = 0
    failed: int = 0
    bytes_queued: int = 0
    bytes_received: int = 0
    bytes_fetched: int = 0
    bytes_skipped: int = 0
    md5_verified: int = 0
    md5_missing: int = 0
    checkpoint_s: float = 0.0


class Downloader:
    """Copies `config.prefix` of `storage` to `config.dest`. Run once with `run()`."""

    def __init__(self, storage: StorageClient, config: DownloadConfig) -> None:
        self._storage = storage
        self._config = config
        self._filter = NameFilter(config.includes, config.excludes)
        self._dest = Destination(config.dest)
        self._c = _Counters()
        self._failures: list[Failure] = []
        self._pending: list[Record] = []
        self._fatal: str | None = None
        self._started: float | None = None
        self._ended: float | None = None
        # worker threads: one per transfer for writes, plus the lister and the checkpoint
        self._threads = trio.CapacityLimiter(config.transfers + 2)
        self._direct = DirectWrites(config.part_size) if config.direct_io else None

    # -- what callers read ---------------------------------------------------------------

    def statistics(self) -> DownloadStats:
        end = self._ended if self._ended is not None else time.monotonic()
        elapsed = 0.0 if self._started is None else end - self._started
        direct = 0 if self._direct is None else self._direct.statistics().direct_bytes
        return DownloadStats(**dataclasses.asdict(self._c), bytes_direct=direct, elapsed_s=elapsed)

    def result(self) -> DownloadResult:
        return DownloadResult(self.statistics(), tuple(self._failures), self._fatal)

    # -- running -------------------------------------------------------------------------

    async def _thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._threads)

    async def run(self) -> DownloadResult:
        """Download everything; return what happened. Failed blobs do not raise: they are in
        the result. Cancellation propagates after cleaning up (see the module docstring).

        Raises:
            DestinationError: DEST cannot be used (not a folder, locked by another download).
        """
        self._started = time.monotonic()
        await self._thread(self._dest.open)
        try:
            manifest = await self._thread(
                Manifest.open, self._config.dest, self._config.manifest_path
            )
        except BaseException:
            self._dest.close()
            raise
        try:
            await self._run(manifest)
        finally:
            with trio.CancelScope(shield=True):
                await self._checkpoint(manifest, final=True)
                await self._thread(manifest.close)
                await self._thread(self._dest.close)
                if self._direct is not None:
                    self._direct.close()
                self._ended = time.monotonic()
        return self.result()

    async def _run(self, manifest: Manifest) -> None:
        config = self._config
        transfers = Transfers(
            self._storage,
            self._dest,
            TransferConfig(config.part_size, config.verify, config.write_in_thread),
            slots=trio.CapacityLimiter(config.transfers),
            threads=self._threads,
            direct=self._direct,
        )
        planner = Planner(
            prefix=config.prefix,
            location=self._storage.location,
            dest=self._dest,
            manifest=manifest,
            name_filter=self._filter,
            verify=config.verify,
        )
        send, receive = trio.open_memory_channel[Item](config.page_size)
        async with trio.open_nursery() as outer:
            outer.start_soon(self._checkpoint_loop, manifest)
            async with trio.open_nursery() as work:
                async with receive:
                    for _ in range(config.transfers):
                        work.start_soon(self._worker, receive.clone(), transfers, manifest)
                work.start_soon(self._list, send, planner)
            outer.cancel_scope.cancel()

    async def _list(self, send: trio.MemorySendChannel[Item], planner: Planner) -> None:
        prefix = self._config.prefix
        async with send:
            token: str | None = None
            try:
                while True:
                    page = await self._storage.list_page(
                        prefix,
                        delimiter=None,
                        continuation=token,
                        max_results=self._config.page_size,
                    )
                    items = await self._thread(planner.classify, page.blobs)
                    self._c.listed += len(items)
                    for item in items:
                        if self._account(item):
                            await send.send(item)
                    token = page.continuation
                    if token is None:
                        break
            except StorageError as exc:
                self._fatal = f"listing stopped: {exc}"
                log.error("%s", self._fatal)
                return
            except sqlite3.Error as exc:
                self._fatal = f"the manifest {MANIFEST_NAME} cannot be read: {exc}"
                log.error("%s", self._fatal)
                return
        self._c.listing_done = True
        log.info("listed %d blobs under %r", self._c.listed, prefix)

    def _account(self, item: Item) -> bool:
        """Count a classified item; True if a worker must handle it."""
        blob = item.blob
        match item.action:
            case Action.FETCH:
                self._c.files_queued += 1
                self._c.bytes_queued += blob.size
                return True
            case Action.CHECK | Action.FOLDER:
                return True
            case Action.SKIP:
                self._c.files_skipped += 1
                self._c.bytes_skipped += blob.size
                if self._config.verify and blob.content_md5 is None:
                    self._c.md5_missing += 1
                return False
            case Action.REFUSE:
                self._fail(blob.name, item.reason)
                return False
            case Action.FILTERED:
                self._c.filtered += 1
                return False
            case Action.IGNORE:
                return False

    def _fail(self, name: str, reason: str) -> None:
        self._c.failed += 1
        if len(self._failures) < self._config.max_failure_details:
            self._failures.append(Failure(name, reason))
            log.warning("%s: %s", name, reason)

    async def _worker(
        self, receive: trio.MemoryReceiveChannel[Item], transfers: Transfers, manifest: Manifest
    ) -> None:
        async with receive:
            async for item in receive:
                try:
                    await self._handle(item, transfers, manifest)
                except (StorageError, TransferError, OSError) as exc:
                    self._fail(item.blob.name, _describe(exc))

    async def _handle(self, item: Item, transfers: Transfers, manifest: Manifest) -> None:
        if item.action is Action.FOLDER:
            await self._thread(self._dest.make_folder, item.rel)
            self._c.folders += 1
            return
        if item.action is Action.CHECK:
            assert item.blob.content_md5 is not None
            assert item.record is not None
            digest = await self._thread(file_md5, self._dest.path / item.rel)
            if digest == item.blob.content_md5:
                self._c.files_skipped += 1
                self._c.bytes_skipped += item.blob.size
                self._c.md5_verified += 1
                self._pending.append(dataclasses.replace(item.record, md5_verified=True))
                return
            log.info("%s: the local copy does not match Content-MD5; downloading again", item.rel)
            self._c.files_queued += 1
            self._c.bytes_queued += item.blob.size
        await self._fetch(item.blob, item.rel, transfers)

    async def _fetch(self, blob: BlobProps, rel: str, transfers: Transfers) -> None:
        attempt = 0
        while True:
            attempt += 1
            received = 0

            def on_bytes(n: int) -> None:
                nonlocal received
                received += n
                self._c.bytes_received += n

            try:
                fetched = await transfers.fetch(blob, rel, on_bytes)
                break
            except (BlobChanged, TransferError) as exc:
                if attempt >= MAX_ATTEMPTS:
                    raise
                # the progress total grows by what this attempt wasted
                self._c.bytes_queued += received
                if isinstance(exc, BlobChanged):
                    log.info("%s changed during its download; fetching the new version", rel)
                    new = await self._storage.get_properties(blob.name)
                    if new.is_dir_marker:
                        raise TransferError("it became a folder marker") from None
                    self._c.bytes_queued += new.size - blob.size
                    blob = new
                else:
                    log.warning("%s: %s; fetching it again", rel, exc)
        self._c.files_fetched += 1
        self._c.bytes_fetched += blob.size
        if fetched.md5_verified:
            self._c.md5_verified += 1
        elif self._config.verify:
            self._c.md5_missing += 1
        self._pending.append(
            Record(
                path=rel,
                source=source_id(self._storage.location, blob.name),
                size=blob.size,
                etag=blob.etag,
                last_modified=blob.last_modified,
                mtime_ns=fetched.mtime_ns,
                md5_verified=fetched.md5_verified,
            )
        )

    # -- checkpoints ---------------------------------------------------------------------

    async def _checkpoint_loop(self, manifest: Manifest) -> None:
        while True:
            await trio.sleep(self._config.checkpoint_interval_s)
            await self._checkpoint(manifest)

    async def _checkpoint(self, manifest: Manifest, *, final: bool = False) -> None:
        if not self._pending:
            return
        # only files complete *now* are recorded, after the sync below made them durable
        batch, self._pending = self._pending, []
        started = time.monotonic()
        try:
            await self._thread(self._sync_and_save, manifest, batch)
            self._c.checkpoint_s += time.monotonic() - started
        except (OSError, sqlite3.Error) as exc:
            self._pending[:0] = batch  # try again at the next checkpoint
            log.warning(
                "could not save download progress to the manifest (%s)%s",
                exc,
                "; a rerun will download these files again" if final else "",
            )

    def _sync_and_save(self, manifest: Manifest, batch: list[Record]) -> None:
        self._dest.sync()
        manifest.save(batch)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        # for a rename, filename2 is the final path: the one the user knows
        path = exc.filename2 or exc.filename
        where = f": {path}" if path else ""
        return f"local file error: {exc.strerror or exc}{where}"
    return str(exc)
