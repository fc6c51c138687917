"""A mount's processes: `run` serves it in this process (`daemon.serve`) or, with
DATASET_MOUNT_WORKER_PROCESSES above 1, in several.

The order is what libfuse and fork allow (docs/developer-notes/multicore.md, "How a route-1
mount starts"):

1. the source (and the metrics address) are checked in a short-lived child, so this process
   starts no thread before it forks and a bad source stops the mount before anything is mounted;
2. the shared state (names, handles, open versions, stats, the account's breaker) is created,
   the mount is made, INIT is answered in a helper thread (`fuse_processes.answer_init`) and
   the kernel is tuned;
3. a zygote forks the workers (and replaces a worker that dies); every process, this one
   included, then builds its own storage client and parts, with its share of the memory budgets,
   and serves the connection. This process also serves the stats socket, the hints socket and
   the metrics endpoint, with figures summed over every process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pickle
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pyfuse3
import trio

from blobmount.compose.configs import fuse_options, read_ahead_budget
from blobmount.compose.mount import MountParts, open_mount
from blobmount.compose.storage import StorageStack, check_source, open_storage
from blobmount.daemon import (
    FUSE_IDLE_WORKERS,
    MountRequest,
    Served,
    live_snapshot,
    on_signals,
    serve,
    serve_mounted,
    tune_kernel,
)
from blobmount.errors import BlobmountError, exit_status
from blobmount.fs import wakeup
from blobmount.fs.forward import MAIN_PROCESS, ReadForwarder, ReadServer
from blobmount.fs.fuse_ops import FuseOperations
from blobmount.fuse_processes import EXIT_CONNECTION_ENDED, Zygote, answer_init
from blobmount.memory_limit import usable_memory_bytes
from blobmount.metrics import Metrics, open_metrics
from blobmount.mountpoint import prepare_mountpoint
from blobmount.multiproc.namespace import SharedNamespace
from blobmount.process_stats import StatsShare, publish_every
from blobmount.readiness import ReadyNotifier
from blobmount.runstate import pid_alive
from blobmount.settings import Settings
from blobmount.storage.shared_flow import SharedFlow
from blobmount.storage.shared_pages import SharedListPages
from blobmount.units import format_size

log = logging.getLogger(__name__)

#: where the shared state of a mount lives: memory, not disk (tables are written per request)
SHARED_ROOT = Path("/dev/shm")
SHARED_PREFIX = "blobmount-"
#: the list pages the processes share, in the shared folder
PAGES = "pages"


@dataclass(frozen=True, slots=True)
class _Mount:
    """What every process of the mount shares (inherited through fork)."""

    request: MountRequest
    ops: FuseOperations
    namespace: SharedNamespace
    stats: StatsShare
    folder: Path
    #: the account's breaker and Retry-After pause, one for every process
    flow: SharedFlow


def process_share(settings: Settings, processes: int, index: int) -> Settings:
    """Process `index`'s settings: the memory budgets divided between the processes, so the
    settings bound the whole tree (the disk cache is one folder every process prunes). The
    hint memory is the main process's alone: it serves the hints socket, and the opens of
    hinted files are passed to it (multiproc/hinted_names.py)."""
    if processes <= 1:
        return settings
    read_ahead = read_ahead_budget(settings, usable_memory_bytes())
    return settings.model_copy(
        update={
            "memory_cache_size": settings.memory_cache_size // processes,
            "read_ahead_memory_limit": max(1, read_ahead // processes),
            "hint_memory_limit": settings.hint_memory_limit if index == MAIN_PROCESS else 0,
        }
    )


def run(request: MountRequest, notifier: ReadyNotifier) -> int:
    """Run a mount until it ends, in this process (`daemon.serve`) or, with
    DATASET_MOUNT_WORKER_PROCESSES above 1, in this one and its workers. Returns the process
    exit status."""
    try:
        prepare_mountpoint(request.mountpoint, allow_non_empty=request.allow_non_empty)
        # Resolve symlinks now: once mounted, any stat of the mount point from this process
        # would wait for this very process to answer it.
        request = dataclasses.replace(request, mountpoint=request.mountpoint.resolve())
        if request.settings.worker_processes > 1:
            serve_processes(request, notifier)
        else:
            trio.run(serve, request, notifier)
    except BlobmountError as exc:
        log.error("%s", exc)
        notifier.error(str(exc))
        return exit_status(exc)  # the kind of failure, for `blobmount mount` and systemd
    return 0


def serve_processes(request: MountRequest, notifier: ReadyNotifier) -> None:
    """Mount with `request.settings.worker_processes` processes and serve until unmounted.
    Raises BlobmountError for anything that stops the mount before it is mounted."""
    settings, spec = request.settings, request.spec
    _check_in_child(request)
    folder = _shared_folder()
    (folder / PAGES).mkdir()
    namespace = SharedNamespace.create(folder, settings.worker_processes)
    flow = SharedFlow.create(folder)
    mount = _Mount(request, FuseOperations(), namespace, StatsShare(folder), folder, flow)
    zygote = Zygote(settings.worker_processes - 1, lambda index: _run_worker(mount, index))
    try:
        pyfuse3.init(mount.ops, str(request.mountpoint), fuse_options(settings, spec))

        def on_init(callback: Callable[[], None]) -> None:
            mount.ops.on_init = callback

        answer_init(on_init)
        tune_kernel(request)  # no thread is left behind: `mount` of fusectl runs to its end
        zygote.start()
        trio.run(_serve_main, mount, zygote, notifier)
    finally:
        # the workers end with the connection; each may still be writing its disk tier queue
        zygote.stop(timeout_s=float(settings.unmount_timeout_s))
        namespace.close()
        flow.close()
        shutil.rmtree(folder, ignore_errors=True)
    log.info("unmounted %s", request.mountpoint)


def _shared_folder() -> Path:
    """A new folder for this mount's shared state; folders of mounts whose process is gone
    (killed) are removed first."""
    root = SHARED_ROOT if SHARED_ROOT.is_dir() else Path(tempfile.gettempdir())
    for old in root.glob(f"{SHARED_PREFIX}*"):
        pid = old.name[len(SHARED_PREFIX) :].split("-")[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{SHARED_PREFIX}{os.getpid()}-", dir=root))


# -- the check before mounting ---------------------------------------------------------------


def _check_in_child(request: MountRequest) -> None:
    """Check the source and the metrics address as a single-process mount does, in a child:
    the storage client starts threads, and this process must have none when it forks."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        status = 0
        try:
            trio.run(_check, request)
        except BaseException as exc:
            status = 1
            try:
                os.write(write_end, pickle.dumps(exc))
            except Exception:
                os.write(write_end, pickle.dumps(BlobmountError(str(exc))))
        os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        data = answer.read()
    _, raw = os.waitpid(pid, 0)
    if not data and os.waitstatus_to_exitcode(raw) == 0:
        return
    try:
        problem = pickle.loads(data)
    except Exception:
        problem = BlobmountError(f"the check before mounting failed (status {raw})")
    raise problem


async def _check(request: MountRequest) -> None:
    settings = request.settings
    async with open_storage(settings, request.spec) as stack:
        await check_source(stack.client, request.spec)
    async with open_metrics(settings.metrics_addr):
        pass  # a port in use is a configuration error, found before anything is mounted


# -- every process ---------------------------------------------------------------------------


@asynccontextmanager
async def _process_parts(mount: _Mount, index: int) -> AsyncIterator[MountParts]:
    """This process's parts, serving the mount's requests from when they are built."""
    mount.namespace.bind(index)
    wakeup.enable_blocked_read_wakeup()
    # the check before mounting logged the source and the settings; every process opening its
    # storage would log them again, with its share of the budgets
    logging.getLogger("blobmount.compose.storage").setLevel(logging.WARNING)
    settings = process_share(mount.request.settings, mount.request.settings.worker_processes, index)
    if index == 0:
        log.info(
            "%d processes serve the mount; each has its share of the memory budgets: RAM cache "
            "%s, read-ahead %s; hint memory %s in the main process",
            mount.request.settings.worker_processes,
            format_size(settings.memory_cache_size),
            format_size(settings.read_ahead_memory_limit or 0),
            format_size(settings.hint_memory_limit),
        )
    async with (
        open_storage(settings, mount.request.spec, shared_flow=mount.flow) as own_stack,
        open_mount(
            settings,
            mount.request.spec,
            _with_shared_pages(own_stack, mount.folder, settings),
            shared=mount.namespace,
        ) as parts,
        trio.open_nursery() as forwarding,
    ):
        # READs of this process's handles that land in another process come back here
        server = ReadServer(
            mount.folder,
            index,
            parts.fs.read,
            wakeup.wake,
            parts.fs.open_for_another,
            parts.fs.hint_notice,
        )
        await forwarding.start(server.run)
        forwarder = ReadForwarder(mount.folder, index, forwarding, wakeup.wake)
        parts.fs.forwarder = forwarder
        parts.fs.read_server = server
        mount.ops.fs = parts.fs
        try:
            yield parts
        finally:
            forwarding.cancel_scope.cancel()
            forwarder.close()
            log.info(
                "process %d (pid %d): %d signals to wake a blocked read of the FUSE device",
                index,
                os.getpid(),
                wakeup.wakeups(),
            )


def _with_shared_pages(stack: StorageStack, folder: Path, settings: Settings) -> StorageStack:
    """The stack with the list pages of every process shared (storage/shared_pages.py), so the
    processes see one view of each folder; a snapshot's stack is left as it is (the snapshot
    is the view)."""
    if settings.snapshot is not None:
        return stack
    ttl_ms = settings.attribute_cache_ttl_ms
    pages = SharedListPages(stack.client, folder / PAGES, None if ttl_ms is None else ttl_ms / 1000)
    return dataclasses.replace(stack, client=pages)


def _run_worker(mount: _Mount, index: int) -> int:
    """A worker's life (in the process the zygote forked): the status that tells the zygote
    the connection ended. An exception ends it with another status, and it is replaced."""
    trio.run(_serve_worker, mount, index)
    return EXIT_CONNECTION_ENDED


async def _serve_worker(mount: _Mount, index: int) -> None:
    async with _process_parts(mount, index) as parts:
        async with trio.open_nursery() as nursery:
            _, live = live_snapshot(mount.request, parts, mount.ops, main=False)
            await nursery.start(publish_every, mount.stats, live.snapshot)
            # the main process passes SIGTERM/SIGINT on and unmounts once every process has
            # let its requests in flight finish (or the unmount timeout has passed)
            fuse_scope = trio.CancelScope()
            timeout_s = mount.request.settings.unmount_timeout_s
            nursery.start_soon(on_signals, mount.ops, timeout_s, fuse_scope)
            log.info("worker %d (pid %d) serves %s", index, os.getpid(), mount.request.mountpoint)
            with fuse_scope:
                await pyfuse3.main(min_tasks=FUSE_IDLE_WORKERS)
            nursery.cancel_scope.cancel()
        # the connection has ended: the SIGTERM the zygote sends its workers at unmount must
        # not cut short the closing of the parts (the disk tier writes what it has queued)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


async def _serve_main(mount: _Mount, zygote: Zygote, notifier: ReadyNotifier) -> None:
    serving = False  # from then on, serve_mounted unmounts whatever happens
    try:
        async with (
            open_metrics(mount.request.settings.metrics_addr) as metrics,
            _process_parts(mount, 0) as parts,
        ):
            serving = True
            await _serve_parts(mount, zygote, notifier, metrics, parts)
    finally:
        if not serving:  # mounted before the parts were built: a failure there unmounts too
            pyfuse3.close(unmount=True)


async def _serve_parts(
    mount: _Mount, zygote: Zygote, notifier: ReadyNotifier, metrics: Metrics, parts: MountParts
) -> None:
    tuned = trio.Event()
    tuned.set()  # tuned before the fork

    workers = _Workers()

    def also(nursery: trio.Nursery) -> None:
        nursery.start_soon(_follow_workers, zygote, workers)

    async def finish_workers(signum: int) -> None:
        for pid in workers.pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        await workers.all_ended()

    served = Served(parts, mount.ops, metrics, tuned, mount.stats.refreshed, also, finish_workers)
    await serve_mounted(mount.request, notifier, served)


class _Workers:
    """The live workers (index -> pid), as the zygote reports them."""

    def __init__(self) -> None:
        self.pids: dict[int, int] = {}
        self._none_left: trio.Event | None = None

    def started(self, index: int, pid: int) -> None:
        self.pids[index] = pid

    def ended(self, index: int, pid: int) -> None:
        if self.pids.get(index) == pid:
            del self.pids[index]
        if not self.pids and self._none_left is not None:
            self._none_left.set()

    async def all_ended(self) -> None:
        if self.pids:
            self._none_left = trio.Event()
            await self._none_left.wait()


async def _follow_workers(zygote: Zygote, workers: _Workers) -> None:
    """Keep `workers` as the zygote reports starts and ends, and log them."""
    while True:
        await trio.lowlevel.wait_readable(zygote.events_fd)
        events = zygote.read_events()
        if not events:  # the zygote's end of the pipe closed: it is gone
            log.error("the worker zygote ended: a worker that dies is not replaced")
            return
        for event in events:
            if event.kind == "started":
                workers.started(event.index, event.pid)
                log.info("worker %d started (pid %d)", event.index, event.pid)
                continue
            workers.ended(event.index, event.pid)
            if event.status == EXIT_CONNECTION_ENDED:
                log.info("worker %d (pid %d) ended with the connection", event.index, event.pid)
            else:
                log.warning(
                    "worker %d (pid %d) died (status %d); a new one replaces it",
                    event.index,
                    event.pid,
                    event.status,
                )
