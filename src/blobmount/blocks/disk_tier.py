"""Disk tier: a persistent, verified, bounded block cache under DATASET_MOUNT_CACHE_DIR.

A block file holds one block of one blob version: a fixed header (magic, format version, CRC-32
of the data, block size, block index, data length, key length), the key (location, blob name,
ETag) and the data. Its name is a hash of the key (`cachedir.layout`), so nothing from storage
ever becomes a path. docs/developer-notes/cache-format.md has the byte layout.

- `get` returns a block only after checking everything in the header against the key asked for,
  the file's length against the header, and the CRC against the data. A file that fails is
  removed (if it is still the file that was read) and `get` returns None, so the block is
  refetched from storage and never served wrong.
- `put` queues the block for a background write (`disk_writer`) and returns at once; the writer
  reserves room with the pruner (`cachedir.pruner`), writes a temporary, renames it into place.
- A hit touches the file's mtime (at most once a `touch_interval_s`), which is the LRU order the
  pruner uses, so the order survives restarts.
- File I/O runs in worker threads (`trio.to_thread.run_sync`): reads bounded by
  DATASET_MOUNT_READ_THREADS, writes by DATASET_MOUNT_BLOCK_FILE_CACHE_WRITE_THREADS. The one
  exception: a small block is read on the trio thread while the disk answers fast, since the
  thread hop costs more than the read (`blocks.inline_reads`). See
  docs/developer-notes/concurrency.md, "Disk tier".

A cache that cannot be used (no permission, disk full, I/O errors) never fails a read: the
block is served from storage and the problem is logged once.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import time
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from blobmount.blocks.disk_writer import DiskWriter, DiskWriterConfig, DiskWriterStats, WriteOutcome
from blobmount.blocks.inline_reads import INLINE_MAX_BYTES, InlineReadGate, InlineReadStats
from blobmount.blocks.keys import BlockKey
from blobmount.cachedir.layout import (
    CacheLayout,
    allocated_bytes,
    atomic_write,
    entry_name,
    free_bytes,
)
from blobmount.cachedir.pruner import Pruner, PrunerConfig, PrunerStats
from blobmount.cachedir.session import background_tasks, using_cache_dir
from blobmount.cachedir.shared_budget import SharedBudgetCounters
from blobmount.cachedir.space import SpaceConfig, allocated_size

log = logging.getLogger(__name__)

KIND = "blocks"
MAGIC = b"BMBLOCK\n"
FORMAT_VERSION = 1
#: magic, version, flags, crc32, block_size, index, data_len, key_len (little-endian)
HEADER = struct.Struct("<8sHHIIQQI")
_U32 = struct.Struct("<I")
#: how long a `cache clear` may hold the directory before a starting mount goes on without it


# -- the file format (pure) -----------------------------------------------------------------


def key_bytes(location: str, key: BlockKey) -> bytes:
    """The key as stored in a block file: location, blob name and ETag, length-prefixed."""
    out = bytearray()
    for text in (location, key.name, key.etag):
        raw = text.encode("utf-8", "surrogatepass")
        out += _U32.pack(len(raw))
        out += raw
    return bytes(out)


def encode_header(location: str, key: BlockKey, block_size: int, data: bytes) -> bytes:
    stored_key = key_bytes(location, key)
    crc = zlib.crc32(data)
    fixed = HEADER.pack(
        MAGIC, FORMAT_VERSION, 0, crc, block_size, key.index, len(data), len(stored_key)
    )
    return fixed + stored_key


def block_path(layout: CacheLayout, location: str, key: BlockKey, block_size: int) -> Path:
    """Where block `key` (of blocks of `block_size` bytes) lives in the cache directory."""
    return Path(block_path_in(str(layout.location_dir(KIND, location)), key, block_size))


def block_path_in(folder: str, key: BlockKey, block_size: int) -> str:
    """`block_path` in a location's folder already known (it is a hash: worth keeping), as a
    plain string: pathlib would cost more than the hash on the hot path."""
    name = entry_name((key.name, key.etag, str(key.index), str(block_size)))
    return f"{folder}/{name[:2]}/{name}"


@dataclass(frozen=True, slots=True)
class BlockRead:
    data: bytes | None  # the verified block, or None
    problem: str | None = None  # why the file was rejected (None: a plain miss)
    removed_bytes: int = 0  # bytes freed by removing a rejected file


def _read_exact(fd: int, n: int) -> bytes:
    data = os.read(fd, n)
    if len(data) == n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def read_block_file(
    path: str | Path, expected_key: bytes, block_size: int, index: int, touch_after_s: float
) -> BlockRead:
    """(worker thread) Read and verify one block file; remove it if it fails verification.

    Raises OSError only for errors other than "no such file" (those are plain misses).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return BlockRead(None)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        return BlockRead(None, "a symbolic link", _remove_if(path, None))
    try:
        st = os.fstat(fd)
        verdict = _verify(fd, st, expected_key, block_size, index)
        if isinstance(verdict, bytes):
            if time.time() - st.st_mtime > touch_after_s:
                try:
                    os.utime(fd)  # the LRU order, kept in the file so it survives restarts
                except OSError:
                    pass
            return BlockRead(verdict)
    finally:
        os.close(fd)
    return BlockRead(None, verdict, _remove_if(path, st))


def _verify(
    fd: int, st: os.stat_result, expected_key: bytes, block_size: int, index: int
) -> bytes | str:
    """The block's data if the open file is a valid copy of the expected block, else why not."""
    # the header and the key in one read: a syscall fewer per hit
    head = _read_exact(fd, HEADER.size + len(expected_key))
    if len(head) < HEADER.size:
        return f"truncated header ({st.st_size} bytes)"
    magic, version, _flags, crc, size, idx, data_len, key_len = HEADER.unpack_from(head)
    if magic != MAGIC:
        return "not a block file"
    if version != FORMAT_VERSION:
        return f"format version {version}"
    if size != block_size or idx != index or key_len != len(expected_key):
        return "a different block"
    expected_size = HEADER.size + key_len + data_len
    if st.st_size != expected_size:
        return f"length {st.st_size}, header says {expected_size}"
    if head[HEADER.size :] != expected_key:
        return "a different block"
    data = _read_exact(fd, data_len)
    if len(data) != data_len:
        return f"short read ({len(data)} of {data_len} bytes)"
    if zlib.crc32(data) != crc:
        return "checksum mismatch"
    return data


def _remove_if(path: str | Path, st: os.stat_result | None) -> int:
    """Remove `path` if it is still the file `st` describes (a writer may have replaced it with
    a good copy since). Returns the bytes freed."""
    try:
        now = os.stat(path, follow_symlinks=False)
        if st is not None and (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev):
            return 0
        os.unlink(path)
    except OSError:
        return 0
    return allocated_bytes(now)


def write_block_file(
    path: str, location: str, key: BlockKey, block_size: int, data: bytes
) -> tuple[int, int]:
    """(worker thread) Write one block file unless one is there. Returns (bytes the new file
    occupies, or -1 if it was there; free bytes on the disk after). Raises OSError."""
    if os.path.lexists(path):
        return -1, free_bytes(os.path.dirname(path))[0]
    header = encode_header(location, key, block_size, data)
    size = atomic_write(path, (header, data))
    return size, free_bytes(os.path.dirname(path))[0]


# -- configuration and statistics ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DiskTierConfig:
    enabled: bool
    root: Path
    block_size: int
    space: SpaceConfig
    max_queue_bytes: int
    write_threads: int
    read_threads: int
    #: a hit moves a block to the front of the LRU order at most this often
    touch_interval_s: float = 60.0
    rescan_interval_s: float = 300.0
    #: how long closing may take to write out what is still queued
    drain_timeout_s: float = 30.0
    #: blocks up to this size may be read on the trio thread (`blocks.inline_reads`)
    inline_read_max_bytes: int = INLINE_MAX_BYTES


@dataclass(frozen=True, slots=True)
class DiskTierStats:
    cache_dir: str
    block_size: int  # blocks are cached per block size (`blobmount warm` sizes files with it)
    hits: int
    hit_bytes: int
    misses: int
    queue_hits: int  # served from the write queue, before reaching the disk
    inline: InlineReadStats  # hits read on the trio thread rather than a worker thread
    corrupt: int  # files that failed verification (removed, block refetched)
    read_errors: int
    writer: DiskWriterStats
    space: PrunerStats


# -- the tier ----------------------------------------------------------------------------------


class BlockDiskTier:
    """The disk tier of one mount (one location). Implements `blocks.fetcher.DiskTier`.

    Build with `open_block_disk_tier`, which also runs its writer and pruner tasks.
    """

    def __init__(
        self,
        config: DiskTierConfig,
        location: str,
        layout: CacheLayout,
        alloc_unit: int,
        *,
        shared_budget: SharedBudgetCounters | None = None,
    ) -> None:
        self.config = config
        self.location = location
        self.layout = layout
        self._alloc_unit = alloc_unit
        self.pruner = Pruner(
            layout,
            PrunerConfig(config.space, rescan_interval_s=config.rescan_interval_s),
            shared_budget=shared_budget,
        )
        self.writer: DiskWriter[BlockKey] = DiskWriter(
            DiskWriterConfig(config.max_queue_bytes, config.write_threads), self._write
        )
        self._read_limiter = trio.CapacityLimiter(max(1, config.read_threads))
        self._inline = InlineReadGate(config.inline_read_max_bytes)
        self._folder = str(layout.location_dir(KIND, location))
        self._write_limiter = trio.CapacityLimiter(max(1, config.write_threads))
        self._hits = 0
        self._hit_bytes = 0
        self._misses = 0
        self._queue_hits = 0
        self._corrupt = 0
        self._read_errors = 0
        self._errors_logged: set[str] = set()

    def path(self, key: BlockKey) -> Path:
        return Path(self._file(key))

    def _file(self, key: BlockKey) -> str:
        return block_path_in(self._folder, key, self.config.block_size)

    async def get(self, key: BlockKey, size: int | None = None) -> bytes | None:
        """The verified block, or None (missing, or rejected and removed). Never raises.

        `size` is the block's length when the caller knows it: a small block is then read on
        the trio thread while the disk is fast (`blocks.inline_reads`)."""
        data = self.writer.pending(key)
        if data is not None:
            self._queue_hits += 1
            return data
        args = (
            self._file(key),
            key_bytes(self.location, key),
            self.config.block_size,
            key.index,
            self.config.touch_interval_s,
        )
        try:
            if self._inline.allows(size):
                started = time.monotonic()
                try:
                    result = read_block_file(*args)
                finally:
                    self._inline.record(time.monotonic() - started)
                await trio.lowlevel.checkpoint()  # a run of small blocks still lets others in
            else:
                result = await trio.to_thread.run_sync(
                    read_block_file, *args, limiter=self._read_limiter
                )
        except OSError as exc:
            self._read_errors += 1
            self._log_once("read", "cannot read the disk cache %s: %s", self.layout.root, exc)
            return None
        except Exception:  # a bug here must cost a refetch, not a failed read
            self._read_errors += 1
            log.exception("disk cache read of block %d of %s failed", key.index, key.name)
            return None
        if result.data is not None:
            self._hits += 1
            self._hit_bytes += len(result.data)
            return result.data
        if result.problem is None:
            self._misses += 1
            return None
        self._corrupt += 1
        if result.removed_bytes:
            self.pruner.budget.removed(result.removed_bytes)
        log.warning(
            "disk cache: block %d of %s failed verification (%s); removed, fetching it again",
            key.index,
            key.name,
            result.problem,
        )
        return None

    def put(self, key: BlockKey, data: bytes) -> None:
        """Queue a block for writing; never blocks (drops, and counts, when the queue is full)."""
        self.writer.submit(key, data)

    async def _write(self, key: BlockKey, data: bytes) -> WriteOutcome:
        estimate = allocated_size(
            HEADER.size + len(key_bytes(self.location, key)) + len(data), self._alloc_unit
        )
        if not await self.pruner.make_room(estimate):
            return WriteOutcome.NO_SPACE
        path = self._file(key)
        self.pruner.begin_write(path, estimate)
        try:
            written, free = await trio.to_thread.run_sync(
                write_block_file,
                path,
                self.location,
                key,
                self.config.block_size,
                data,
                limiter=self._write_limiter,
            )
        except OSError as exc:
            self.pruner.end_write(path, estimate, 0, None)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                self.pruner.report_full(os.strerror(exc.errno), disk_says_so=True)
            else:
                self._log_once(
                    "write", "cannot write to the disk cache %s: %s", self.layout.root, exc
                )
            return WriteOutcome.FAILED
        except BaseException:
            self.pruner.end_write(path, estimate, 0, None)
            raise
        self.pruner.end_write(path, estimate, max(0, written), free)
        return WriteOutcome.ALREADY_CACHED if written < 0 else WriteOutcome.WRITTEN

    def _log_once(self, kind: str, message: str, *args: object) -> None:
        if kind not in self._errors_logged:
            self._errors_logged.add(kind)
            log.warning(message + " (reads go to storage; logged once)", *args)

    def statistics(self) -> DiskTierStats:
        return DiskTierStats(
            cache_dir=str(self.layout.root),
            block_size=self.config.block_size,
            hits=self._hits,
            hit_bytes=self._hit_bytes,
            misses=self._misses,
            queue_hits=self._queue_hits,
            inline=self._inline.statistics(),
            corrupt=self._corrupt,
            read_errors=self._read_errors,
            writer=self.writer.statistics(),
            space=self.pruner.statistics(),
        )


@asynccontextmanager
async def open_block_disk_tier(
    config: DiskTierConfig, location: str, *, shared_budget: SharedBudgetCounters | None = None
) -> AsyncIterator[BlockDiskTier | None]:
    """The disk tier for `location` with its writer and pruner running, or None when it is
    turned off or its directory cannot be used (logged). On exit, blocks still queued are
    written for up to `drain_timeout_s`, then the tasks are stopped. `shared_budget`: the
    space figures shared by the processes of a multi-process mount."""
    if not config.enabled:
        log.info("disk cache off (DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED=false)")
        yield None
        return
    if config.space.cache_size == 0:
        log.info("disk cache off (DATASET_MOUNT_CACHE_SIZE=0)")
        yield None
        return
    async with using_cache_dir(config.root, KIND, location) as cache_dir:
        if cache_dir is None:
            log.warning("disk cache off: caching in RAM only")
            yield None
            return
        tier = BlockDiskTier(
            config, location, cache_dir.layout, cache_dir.alloc_unit, shared_budget=shared_budget
        )
        log.info("disk cache %s for %s", config.root, location)
        async with background_tasks() as nursery:
            nursery.start_soon(tier.pruner.run)
            nursery.start_soon(tier.writer.run)
            try:
                yield tier
            finally:
                tier.writer.close()
                with trio.CancelScope(shield=True) as drain:
                    drain.deadline = trio.current_time() + config.drain_timeout_s
                    await tier.writer.drained.wait()
                left = tier.writer.statistics().queued_blocks
                if left:
                    log.warning("disk cache: %d queued blocks not written at unmount", left)
