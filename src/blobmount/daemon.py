"""Composition root: settings → source → credentials → storage (+ wrappers) → caches → fs → FUSE.

This is the only module that names concrete classes. It owns the nurseries, pyfuse3's
init/main/close, signal handling, readiness reporting, and the graceful unmount timeout.
Everything that can be checked is checked before anything is mounted.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from blobmount import fusectl
from blobmount.blocks.disk_tier import open_disk_tier
from blobmount.blocks.manager import BlockManager, BlockManagerConfig
from blobmount.errors import BlobmountError, StorageError
from blobmount.fs.filesystem import BlobFilesystem, FsConfig
from blobmount.hints.coordinator import HintConfig, HintCoordinator
from blobmount.hints.server import serve_hints
from blobmount.hints.whole_file import WholeFileHints
from blobmount.memory_limit import usable_memory_bytes
from blobmount.metrics import open_metrics
from blobmount.mounttable import set_read_ahead
from blobmount.readiness import ReadyNotifier
from blobmount.runstate import MountRecord, hints_socket, stats_socket
from blobmount.settings import Settings, describe
from blobmount.source import SourceSpec
from blobmount.stats import Snapshot, ThroughputMeter, as_dict, serve_stats
from blobmount.storage.base import StorageClient
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.retry import RetryingStorageClient
from blobmount.units import format_size
from blobmount.wholefile.cache import open_whole_file_mode

if TYPE_CHECKING:
    from blobmount.fs.fuse_ops import FuseOperations

log = logging.getLogger(__name__)

#: pyfuse3 worker tasks kept waiting for requests: with its default (1) a burst of concurrent
#: requests starts a task for each and ends it right after, a task spawn per request
FUSE_IDLE_WORKERS = 16

#: how long "mounted" waits for the kernel settings to be tuned (a `mount` of fusectl included)
TUNE_WAIT_S = 15.0

#: opens the storage client for a mount (tests and the memory:// benchmark pass their own)
StorageFactory = Callable[[], AbstractAsyncContextManager[StorageClient]]


@dataclass(frozen=True, slots=True)
class MountRequest:
    spec: SourceSpec
    mountpoint: Path
    settings: Settings
    allow_non_empty: bool = False
    log_file: Path | None = None


#: the automatic read-ahead cap: this share of the memory the daemon may use, between room for
#: two and for eight full read-ahead windows
AUTO_READ_AHEAD_MEMORY_SHARE = 16
AUTO_READ_AHEAD_WINDOWS = (2, 8)


def read_ahead_budget(settings: Settings, memory_bytes: int | None = None) -> int:
    """Bytes all open files together may hold in read-ahead: DATASET_MOUNT_READ_AHEAD_MEMORY_LIMIT,
    or automatically 1/16 of `memory_bytes` (the RAM or cgroup limit the daemon runs under),
    kept between two and eight full read-ahead windows.

    Eight readers of a large file, each its own part, read 1.6x faster with room for eight
    windows than for two (docs/CONFIGURATION.md); a sidecar with little memory keeps the two."""
    if settings.read_ahead_memory_limit is not None:
        return settings.read_ahead_memory_limit
    window = max(1, settings.read_buffer_block_count) * settings.read_block_size
    low, high = (n * window for n in AUTO_READ_AHEAD_WINDOWS)
    low = max(low, 4 * settings.read_block_size)
    share = 0 if memory_bytes is None else memory_bytes // AUTO_READ_AHEAD_MEMORY_SHARE
    return max(low, min(high, share))


def block_manager_config(settings: Settings) -> BlockManagerConfig:
    budget = read_ahead_budget(settings, usable_memory_bytes())
    if settings.read_ahead_memory_limit is None:
        log.info("read-ahead memory limit (automatic): %s", format_size(budget))
    return BlockManagerConfig(
        block_size=settings.read_block_size,
        read_ahead_blocks=settings.read_buffer_block_count,
        prefetch_slots=settings.read_threads,
        ram_bytes=settings.memory_cache_size,
        read_ahead_budget_bytes=budget,
        hint_bytes=settings.hint_memory_limit,
        hint_slots=settings.hint_threads,
    )


def fs_config(settings: Settings, spec: SourceSpec) -> FsConfig:
    ttl = settings.attribute_cache_ttl_ms
    return FsConfig(
        blob_prefix=spec.prefix,
        ttl_s=None if ttl is None else ttl / 1000.0,
        uid=os.getuid() if settings.uid is None else settings.uid,
        gid=os.getgid() if settings.gid is None else settings.gid,
        file_mode=settings.file_mode,
        dir_mode=settings.dir_mode,
        mount_time=time.time(),
        block_size=settings.read_block_size,
        listing_mode=settings.listing_mode,
    )


def fuse_options(settings: Settings, spec: SourceSpec) -> set[str]:
    fsname = "".join(c if c.isalnum() or c in ":/._-" else "_" for c in spec.display)
    options = {f"fsname={fsname}", "subtype=blobmount", "ro", "default_permissions", "noatime"}
    if settings.allow_other:
        options.add("allow_other")
    return options


def tune_kernel_read_ahead(mountpoint: str, size: int) -> None:
    """Let the kernel send reads of up to `size` bytes (see blobmount.mounttable); a refusal
    only costs speed, so it is logged, not fatal."""
    if size <= 0:
        return
    try:
        device = set_read_ahead(mountpoint, size)
    except (LookupError, OSError) as exc:
        log.info(
            "kernel read-ahead not raised to %s (%s): sequential reads arrive in the kernel's "
            "default requests (usually 128 KiB)",
            format_size(size),
            exc.strerror if isinstance(exc, OSError) and exc.strerror else exc,
        )
    else:
        log.info("kernel read-ahead of %s (device %s): %s", mountpoint, device, format_size(size))


def tune_kernel_background_requests(mountpoint: str, requests: int) -> None:
    """Let the kernel keep `requests` read-aheads outstanding (see blobmount.fusectl); a
    refusal only costs speed, so it is logged, not fatal."""
    if requests <= 0:
        return
    try:
        if fusectl.ensure_fusectl():
            log.info("mounted fusectl at %s to tune the FUSE connection", fusectl.FUSECTL_ROOT)
        conn = fusectl.set_max_background(mountpoint, requests)
    except (LookupError, OSError) as exc:
        log.info(
            "FUSE background requests not raised to %d (%s): with many readers the kernel may "
            "read small files a page at a time",
            requests,
            exc.strerror if isinstance(exc, OSError) and exc.strerror else exc,
        )
    else:
        log.info("FUSE background requests of %s (connection %s): %d", mountpoint, conn, requests)


@asynccontextmanager
async def open_azure_storage(settings: Settings, spec: SourceSpec) -> AsyncIterator[StorageClient]:
    """The Azure client for `spec`, with its asyncio bridge; closed on exit."""
    from blobmount.storage._aio_bridge import AsyncioBridge
    from blobmount.storage.azure_auth import build_storage_client, resolve_access

    access = resolve_access(spec, os.environ, anonymous=settings.anonymous)
    log.info("storage %s, credentials: %s", spec.display, access.method)
    log.info("settings: %s", "; ".join(f"{name}={value}" for name, value, _ in describe(settings)))
    bridge = AsyncioBridge()
    bridge.start()
    try:
        client = build_storage_client(
            access,
            bridge,
            connect_timeout_s=settings.connect_timeout_s,
            read_timeout_s=settings.read_timeout_s,
            # enough for the prefetch pool, the demand reads beside it, and `download`
            max_connections=max(64, settings.read_threads * 2, settings.downloader_threads),
        )
        try:
            yield client
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()
    finally:
        bridge.close()


async def check_source(storage: StorageClient, spec: SourceSpec) -> None:
    """Fail before mounting if the container is missing, the credentials are refused or the
    endpoint does not answer (raises the matching StorageError, saying which source)."""
    try:
        await storage.list_page(spec.prefix, delimiter="/", max_results=1)
    except StorageError as exc:
        raise type(exc)(f"cannot mount {spec.display}: {exc}") from None


def _probe_mount(mountpoint: Path) -> None:
    # What a user's first `ls` does: stat the root and read one entry.
    os.stat(mountpoint)
    with os.scandir(mountpoint) as entries:
        next(entries, None)


async def serve(
    request: MountRequest,
    notifier: ReadyNotifier,
    storage_factory: StorageFactory | None = None,
) -> None:
    """Mount, serve until unmounted or signalled, then unmount. Raises BlobmountError for
    anything that stops the mount before it is ready."""
    import pyfuse3

    from blobmount.fs.fuse_ops import FuseOperations

    settings, spec = request.settings, request.spec
    opener = storage_factory or (lambda: open_azure_storage(settings, spec))
    async with opener() as azure:
        retrying = RetryingStorageClient(azure, retries=settings.http_retry_count)
        storage = CountingStorageClient(retrying)
        await check_source(storage, spec)
        async with (
            # first: a metrics port in use stops the mount before anything is mounted
            open_metrics(settings.metrics_addr) as metrics,
            open_disk_tier(settings, storage.location) as disk,
            open_whole_file_mode(settings, storage) as whole_files,
            trio.open_nursery() as work,
        ):
            blocks = BlockManager(storage, block_manager_config(settings), work, disk)
            fs = BlobFilesystem(storage, blocks, fs_config(settings, spec), whole_files)
            hints = HintCoordinator(
                HintConfig(window=settings.hint_window_files),
                blocks if whole_files is None else WholeFileHints(whole_files, work),
                fs.version_of,
                spec.prefix,
            )
            blocks.hinted.on_free = hints.room_freed
            fs.open_listener = hints
            ops = FuseOperations(fs)

            tuned = trio.Event()  # the mount is reported ready only once it is tuned

            async def tune() -> None:
                point = str(request.mountpoint)
                try:
                    tune_kernel_read_ahead(point, settings.kernel_read_ahead)
                    await trio.to_thread.run_sync(  # may run `mount`
                        tune_kernel_background_requests, point, settings.kernel_max_background
                    )
                finally:
                    tuned.set()

            # the kernel resets both when it gets the INIT answer: tune just after it
            ops.on_init = lambda: work.start_soon(tune)
            pyfuse3.init(ops, str(request.mountpoint), fuse_options(settings, spec))
            record = MountRecord(
                os.getpid(),
                str(request.mountpoint),
                spec.display,
                str(request.log_file) if request.log_file else None,
            )
            meter = ThroughputMeter(
                lambda: (
                    blocks.statistics().bytes_served
                    + (whole_files.served_bytes if whole_files is not None else 0)
                )
            )
            started = time.monotonic()

            def snapshot() -> Snapshot:
                return {
                    "source": spec.display,
                    "mountpoint": str(request.mountpoint),
                    "pid": os.getpid(),
                    "uptime_s": time.monotonic() - started,
                    "throughput_bytes_per_s": meter.bytes_per_s(),
                    "open_files": fs.open_files,
                    "inodes": len(fs.inodes),
                    "namespace": as_dict(fs.statistics()),
                    "storage": as_dict(storage.statistics()),
                    "retry": as_dict(retrying.statistics()),
                    "blocks": as_dict(blocks.statistics()),
                    "disk": None if disk is None else as_dict(disk.statistics()),
                    "hints": as_dict(hints.statistics()),
                    "whole_file": None
                    if whole_files is None
                    else as_dict(whole_files.statistics()),
                }

            metrics.publish(snapshot)
            try:
                async with trio.open_nursery() as control:
                    fuse_scope = trio.CancelScope()
                    await control.start(serve_stats, stats_socket(request.mountpoint), snapshot)
                    await control.start(
                        serve_hints, hints_socket(request.mountpoint), hints, request.mountpoint
                    )
                    control.start_soon(_sample_every_second, meter)
                    control.start_soon(_on_signals, ops, settings.unmount_timeout_s, fuse_scope)
                    control.start_soon(_report_ready, request, notifier, record, tuned)
                    with fuse_scope:
                        await pyfuse3.main(min_tasks=FUSE_IDLE_WORKERS)
                    control.cancel_scope.cancel()
            finally:
                log.info("unmounting %s", request.mountpoint)
                notifier.stopping()
                # harmless when the kernel side is already gone (fusermount3 -u)
                pyfuse3.close(unmount=True)
                record.remove()
                work.cancel_scope.cancel()
    log.info("unmounted %s", request.mountpoint)


async def _sample_every_second(meter: ThroughputMeter) -> None:
    while True:
        meter.sample()
        await trio.sleep(1)


async def _report_ready(
    request: MountRequest, notifier: ReadyNotifier, record: MountRecord, tuned: trio.Event
) -> None:
    try:
        await trio.to_thread.run_sync(_probe_mount, request.mountpoint)
        # the probe got an answer, so INIT is done and the kernel settings are being tuned;
        # readers that start at "mounted" should find them set (bounded: tuning only logs)
        with trio.move_on_after(TUNE_WAIT_S):
            await tuned.wait()
    except OSError as exc:
        log.error("the mount does not answer: %s", exc)
        notifier.error(f"the mount at {request.mountpoint} does not answer: {exc}")
        import pyfuse3

        pyfuse3.terminate()
        return
    record.save()
    log.info("mounted %s at %s", request.spec.display, request.mountpoint)
    notifier.ready(f"mounted {request.spec.display} at {request.mountpoint}")


async def _on_signals(ops: FuseOperations, timeout_s: float, fuse_scope: trio.CancelScope) -> None:
    """On SIGTERM/SIGINT: let requests in flight finish for up to `timeout_s`, then end the FUSE
    loop; requests still running then are cancelled (their callers get ENOTCONN when the
    connection closes), since pyfuse3.main() would otherwise wait for each of them."""
    import pyfuse3

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info(
                "%s: finishing %d requests in flight (at most %ss), then unmounting",
                signal.Signals(signum).name,
                ops.active_requests,
                timeout_s,
            )
            with trio.move_on_after(timeout_s) as waited:
                await ops.wait_idle()
            pyfuse3.terminate()
            if waited.cancelled_caught:
                log.warning(
                    "%d requests still in flight after %ss; unmounting anyway",
                    ops.active_requests,
                    timeout_s,
                )
                fuse_scope.cancel()
            return


def run(request: MountRequest, notifier: ReadyNotifier) -> int:
    """Run a mount in this process until it ends. Returns the process exit status."""
    from blobmount.mountpoint import prepare_mountpoint

    try:
        prepare_mountpoint(request.mountpoint, allow_non_empty=request.allow_non_empty)
        # Resolve symlinks now: once mounted, any stat of the mount point from this process
        # would wait for this very process to answer it.
        request = dataclasses.replace(request, mountpoint=request.mountpoint.resolve())
        trio.run(serve, request, notifier)
    except BlobmountError as exc:
        log.error("%s", exc)
        notifier.error(str(exc))
        return 1
    return 0
