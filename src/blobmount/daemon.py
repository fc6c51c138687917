"""A mount's process lifetime: pyfuse3 init/main/close, signals, readiness, kernel tuning.

The parts it serves come from `blobmount.compose` (the storage stack, then the caches, blocks,
filesystem and hints); this module adds the FUSE adapter, the stats and hints sockets, the
metrics endpoint, and the graceful unmount timeout. Everything that can be checked is checked
before anything is mounted. `daemon_processes.run` runs it, in one process or several.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pyfuse3
import trio

from blobmount import fusectl
from blobmount.compose.configs import fuse_options
from blobmount.compose.mount import MountParts, open_mount
from blobmount.compose.storage import StorageFactory, check_source, open_storage
from blobmount.fs.fuse_ops import FuseOperations
from blobmount.hints.server import serve_hints
from blobmount.metrics import Metrics, open_metrics
from blobmount.mounttable import set_read_ahead
from blobmount.process_figures import ProcessFigures, this_process
from blobmount.readiness import ReadyNotifier
from blobmount.runstate import MountRecord, hints_socket, stats_socket
from blobmount.settings import Settings
from blobmount.snapshot import LiveMount, MountSnapshot
from blobmount.source import SourceSpec
from blobmount.stats import ThroughputMeter, serve_stats
from blobmount.units import format_size

log = logging.getLogger(__name__)

#: pyfuse3 worker tasks kept waiting for requests: with its default (1) a burst of concurrent
#: requests starts a task for each and ends it right after, a task spawn per request
FUSE_IDLE_WORKERS = 16

#: how long "mounted" waits for the kernel settings to be tuned (a `mount` of fusectl included)
TUNE_WAIT_S = 15.0


@dataclass(frozen=True, slots=True)
class MountRequest:
    spec: SourceSpec
    mountpoint: Path
    settings: Settings
    allow_non_empty: bool = False
    log_file: Path | None = None


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
    settings, spec = request.settings, request.spec
    async with open_storage(settings, spec, storage_factory) as stack:
        await check_source(stack.client, spec)
        async with (
            # first: a metrics port in use stops the mount before anything is mounted
            open_metrics(settings.metrics_addr) as metrics,
            open_mount(settings, spec, stack) as parts,
        ):
            ops = FuseOperations(parts.fs)
            tuned = trio.Event()  # the mount is reported ready only once it is tuned

            async def tune() -> None:
                try:
                    await trio.to_thread.run_sync(tune_kernel, request)  # may run `mount`
                finally:
                    tuned.set()

            # the kernel resets both when it gets the INIT answer: tune just after it
            ops.on_init = lambda: parts.work.start_soon(tune)
            pyfuse3.init(ops, str(request.mountpoint), fuse_options(settings, spec))
            await serve_mounted(request, notifier, Served(parts, ops, metrics, tuned))
    log.info("unmounted %s", request.mountpoint)


def tune_kernel(request: MountRequest) -> None:
    """The kernel settings of the connection that only take effect after INIT."""
    point, settings = str(request.mountpoint), request.settings
    tune_kernel_read_ahead(point, settings.kernel_read_ahead)
    tune_kernel_background_requests(point, settings.kernel_max_background)


@dataclass(frozen=True, slots=True)
class Served:
    """What `serve_mounted` serves: the parts of this process, mounted through `ops`."""

    parts: MountParts
    ops: FuseOperations
    metrics: Metrics
    #: set once the kernel settings are tuned (the mount is reported ready only then)
    tuned: trio.Event
    #: the figures reported for the mount, from this process's own (several processes: summed)
    report: Callable[[MountSnapshot], MountSnapshot] = lambda own: own
    #: more tasks of the mount's life, started with the control tasks
    also: Callable[[trio.Nursery], None] = lambda nursery: None
    #: on SIGTERM/SIGINT, the other processes of the mount finishing their requests
    others: Callable[[int], Awaitable[None]] | None = None


def live_snapshot(
    request: MountRequest, parts: MountParts, ops: FuseOperations, *, main: bool = True
) -> tuple[ThroughputMeter, LiveMount]:
    """This process's live figures (and the meter that samples its throughput); `main`: the
    process that reports for the mount."""
    blocks, whole_files, stack = parts.blocks, parts.whole_files, parts.storage

    def served() -> int:
        whole = whole_files.served_bytes if whole_files is not None else 0
        return blocks.statistics().bytes_served + whole

    meter = ThroughputMeter(served)
    live = LiveMount(
        source=request.spec.display,
        mountpoint=str(request.mountpoint),
        pid=os.getpid(),
        started=time.monotonic(),
        throughput=meter.bytes_per_s,
        fs=parts.fs,
        storage=stack.counting,
        retry=stack.retrying,
        blocks=blocks,
        disk=parts.disk,
        hints=parts.hints,
        whole_file=whole_files,
        flow=stack.flow,
        process=lambda: _process_figures(parts, ops, main, served()),
    )
    return meter, live


def _process_figures(
    parts: MountParts, ops: FuseOperations, main: bool, bytes_served: int
) -> ProcessFigures:
    fs = parts.fs
    forwarder, server = fs.forwarder, fs.read_server
    passed_on = 0 if forwarder is None else forwarder.forwarded + forwarder.opens
    answered = 0 if server is None else server.served
    return this_process(main, ops.requests, passed_on, answered, bytes_served)


async def serve_mounted(request: MountRequest, notifier: ReadyNotifier, served: Served) -> None:
    """Serve a mounted connection until it ends (unmounted, or a signal), then unmount."""
    record = MountRecord(
        os.getpid(),
        str(request.mountpoint),
        request.spec.display,
        str(request.log_file) if request.log_file else None,
    )
    meter, live = live_snapshot(request, served.parts, served.ops)
    own, report = live.snapshot, served.report

    def snapshot() -> MountSnapshot:
        return report(own())

    served.metrics.publish(snapshot)
    try:
        async with trio.open_nursery() as control:
            fuse_scope = trio.CancelScope()
            await control.start(serve_stats, stats_socket(request.mountpoint), snapshot)
            await control.start(
                serve_hints,
                hints_socket(request.mountpoint),
                served.parts.hints,
                request.mountpoint,
            )
            control.start_soon(_sample_every_second, meter)
            control.start_soon(
                on_signals,
                served.ops,
                request.settings.unmount_timeout_s,
                fuse_scope,
                served.others,
            )
            control.start_soon(_report_ready, request, notifier, record, served.tuned)
            served.also(control)
            with fuse_scope:
                await pyfuse3.main(min_tasks=FUSE_IDLE_WORKERS)
            control.cancel_scope.cancel()
    finally:
        log.info("unmounting %s", request.mountpoint)
        notifier.stopping()
        # harmless when the kernel side is already gone (fusermount3 -u)
        pyfuse3.close(unmount=True)
        record.remove()


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
        pyfuse3.terminate()
        return
    record.save()
    log.info("mounted %s at %s", request.spec.display, request.mountpoint)
    notifier.ready(f"mounted {request.spec.display} at {request.mountpoint}")


async def on_signals(
    ops: FuseOperations,
    timeout_s: float,
    fuse_scope: trio.CancelScope,
    others: Callable[[int], Awaitable[None]] | None = None,
) -> None:
    """On SIGTERM/SIGINT: let requests in flight finish for up to `timeout_s`, then end the FUSE
    loop; requests still running then are cancelled (their callers get ENOTCONN when the
    connection closes), since pyfuse3.main() would otherwise wait for each of them.

    `others(signum)`: the other processes of the mount finishing theirs, awaited (within the
    same `timeout_s`) alongside this process's own before its loop ends."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info(
                "%s: finishing %d requests in flight (at most %ss), then unmounting",
                signal.Signals(signum).name,
                ops.active_requests,
                timeout_s,
            )
            with trio.move_on_after(timeout_s) as waited:
                async with trio.open_nursery() as finishing:
                    if others is not None:
                        finishing.start_soon(others, signum)
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
