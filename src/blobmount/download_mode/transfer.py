"""Fetching one blob version into its final local path.

A blob up to `part_size` is one ranged GET, written and renamed in one thread call. A bigger
blob gets a preallocated temp file and is fetched in parts of `part_size`, concurrently, each
written in place with pwrite as it arrives. Every GET is pinned to the ETag from the listing.

Concurrency budget: a part holds one of the shared `slots` (RSLEX_DOWNLOADER_THREADS of them)
from the start of its GET until its bytes are written, so at most `slots` GETs are in flight
and at most `slots * part_size` bytes of data are in memory, whatever the number or size of
the files. A slot is taken *before* a part's task is started, so a 1 TB blob does not make
100,000 waiting tasks.

Why 8 MiB parts: a part has a fixed cost (one HTTP request, its first-byte latency, a
thread hop for the write). At 8 MiB that cost is a few percent of the transfer time even on a
fast link, while 64 transfers hold at most 512 MiB; the benchmark (benchmarks/run.py, scenario
7: download vs download-16MiB) compares part sizes. It is also azcopy's default block size for
downloads.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import trio

from blobmount.download_mode.direct_io import DirectWrites
from blobmount.download_mode.staging import Destination, PartFile
from blobmount.errors import BlobmountError, StorageError
from blobmount.storage.base import BlobProps, StorageClient
from blobmount.units import MiB

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PART_SIZE = 8 * MiB


class TransferError(BlobmountError):
    """The bytes received are not the blob's (short body, Content-MD5 mismatch)."""


@dataclass(frozen=True, slots=True)
class TransferConfig:
    part_size: int = DEFAULT_PART_SIZE
    verify: bool = False
    #: False runs file writes on the trio thread (only for the benchmark's comparison)
    write_in_thread: bool = True
    #: start each write's writeback at once, for a final syncfs that finds little left to do
    start_writeback: bool = True


@dataclass(frozen=True, slots=True)
class Fetched:
    mtime_ns: int  # of the final file
    md5_verified: bool  # Content-MD5 was checked (and matched)


class OrderedDigest:
    """The MD5 of a file whose parts arrive out of order, computed as they arrive.

    A part waits until every part before it has been hashed, then is hashed (in a worker
    thread, which hashlib runs without the GIL). Parts keep their transfer slot while they wait,
    so memory stays within the slots' budget, and hashing overlaps the rest of the download
    instead of re-reading the whole file after it.
    """

    def __init__(self, run: Callable[..., Awaitable[Any]]) -> None:
        self._run = run
        self._md5 = hashlib.md5()
        self._next = 0
        self._turns: dict[int, trio.Event] = {}

    async def add(self, offset: int, data: bytes) -> None:
        if offset != self._next:
            turn = self._turns.setdefault(offset, trio.Event())
            await turn.wait()
            del self._turns[offset]
        await self._run(self._md5.update, data)
        self._next += len(data)
        waiting = self._turns.get(self._next)
        if waiting is not None:
            waiting.set()

    def digest(self, size: int) -> bytes:
        if self._next != size:
            raise TransferError(f"hashed {self._next} of {size} bytes")
        return self._md5.digest()


class Transfers:
    """Fetches blobs into DEST (or any path, with `fetch_to`), sharing `slots` (the transfer
    budget), `threads` (for file writes) and `direct` (O_DIRECT buffers; None writes everything
    through the page cache) between all files."""

    def __init__(
        self,
        storage: StorageClient,
        dest: Destination | None,
        config: TransferConfig,
        *,
        slots: trio.CapacityLimiter,
        threads: trio.CapacityLimiter,
        direct: DirectWrites | None = None,
    ) -> None:
        if config.part_size < 1:
            raise ValueError("part_size must be positive")
        self._storage = storage
        self._dest = dest
        self._config = config
        self._slots = slots
        self._threads = threads
        self._direct = direct

    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        if self._config.write_in_thread:
            # not abandoned on cancel: a write finishes before its file can be discarded
            return await trio.to_thread.run_sync(fn, *args, limiter=self._threads)
        result = fn(*args)
        await trio.lowlevel.checkpoint()
        return result

    async def _get(self, blob: BlobProps, start: int, length: int) -> bytes:
        data = await self._storage.get_range(blob.name, blob.etag, start, length)
        if len(data) != length:
            raise TransferError(
                f"short read: {len(data)} of {length} bytes at offset {start} "
                f"(the listing said {blob.size} bytes)"
            )
        return data

    def _check_md5(self, blob: BlobProps, digest: bytes) -> None:
        assert blob.content_md5 is not None
        if not hmac.compare_digest(digest, blob.content_md5):
            raise TransferError(
                f"Content-MD5 mismatch: expected {blob.content_md5.hex()}, got {digest.hex()}"
            )

    def _wants_md5(self, blob: BlobProps) -> bool:
        return self._config.verify and blob.content_md5 is not None

    async def fetch(self, blob: BlobProps, rel: str, on_bytes: Callable[[int], None]) -> Fetched:
        """Download `blob` (pinned to its ETag) to DEST/`rel`. `on_bytes(n)` is called as data
        lands on disk. Nothing is left under the final name unless it returns.

        Raises:
            StorageError: from the storage client (BlobChanged if the ETag moved on).
            TransferError: wrong bytes received.
            OSError: writing, creating the folder, or renaming failed.
        """
        dest = self._dest
        if dest is None:
            raise RuntimeError("these Transfers have no destination folder: use fetch_to")
        return await self.fetch_to(blob, dest.path / rel, dest.temp_path(), on_bytes)

    async def fetch_to(
        self, blob: BlobProps, final: Path, tmp: Path, on_bytes: Callable[[int], None]
    ) -> Fetched:
        """`fetch` into any `final` path, through the temporary `tmp` (same file system)."""
        if blob.size <= self._config.part_size:
            async with self._slots:
                data = await self._get(blob, 0, blob.size) if blob.size else b""
                fetched = await self._io(self._write_whole, tmp, final, blob, data)
            on_bytes(len(data))
            return fetched
        return await self._fetch_parts(blob, tmp, final, on_bytes)

    def _write_whole(self, tmp: Path, final: Path, blob: BlobProps, data: bytes) -> Fetched:
        verified = False
        if self._wants_md5(blob):
            self._check_md5(blob, hashlib.md5(data).digest())
            verified = True
        part = self._part_file(tmp, len(data), preallocate=False)
        try:
            part.write_at(0, data)
            return Fetched(part.commit(final, blob.last_modified), verified)
        except BaseException:
            part.discard()
            raise

    async def _fetch_parts(
        self, blob: BlobProps, tmp: Path, final: Path, on_bytes: Callable[[int], None]
    ) -> Fetched:
        part_file = await self._io(
            functools.partial(self._part_file, tmp, blob.size, preallocate=True)
        )
        digest = OrderedDigest(self._io) if self._wants_md5(blob) else None
        try:
            errors: list[BaseException] = []
            async with trio.open_nursery() as nursery:

                def failed(exc: BaseException) -> None:
                    # the first failure stops the file: cancel the other parts, report this one
                    if not errors:
                        errors.append(exc)
                    nursery.cancel_scope.cancel()

                for start in range(0, blob.size, self._config.part_size):
                    length = min(self._config.part_size, blob.size - start)
                    borrower = object()
                    await self._slots.acquire_on_behalf_of(borrower)
                    nursery.start_soon(
                        self._part,
                        blob,
                        part_file,
                        digest,
                        start,
                        length,
                        borrower,
                        on_bytes,
                        failed,
                    )
            if errors:
                raise errors[0]
            verified = False
            if digest is not None:
                self._check_md5(blob, digest.digest(blob.size))
                verified = True
            mtime_ns = await self._io(part_file.commit, final, blob.last_modified)
            return Fetched(mtime_ns, verified)
        except BaseException:
            part_file.discard()
            raise

    def _part_file(self, tmp: Path, size: int, *, preallocate: bool) -> PartFile:
        return PartFile(
            tmp,
            size,
            preallocate=preallocate,
            writeback=self._config.start_writeback,
            direct=self._direct,
        )

    async def _part(
        self,
        blob: BlobProps,
        part_file: PartFile,
        digest: OrderedDigest | None,
        start: int,
        length: int,
        borrower: object,
        on_bytes: Callable[[int], None],
        failed: Callable[[BaseException], None],
    ) -> None:
        try:
            data = await self._get(blob, start, length)
            await self._io(part_file.write_at, start, data)
            if digest is not None:
                await digest.add(start, data)
            on_bytes(length)
        except (StorageError, TransferError, OSError) as exc:
            failed(exc)
        finally:
            self._slots.release_on_behalf_of(borrower)
