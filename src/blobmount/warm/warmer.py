"""Reading files through a live mount, several at a time, within the cache's limits.

Threads: the caller's (lists nothing, decides: takes the next file, checks it fits, hands it to
a reader), `--jobs` readers, a walker that lists the tree ahead of them (so the progress bar has
a total), a monitor that polls the daemon's stats, and an optional progress ticker. Everything
the daemon does happens because a reader read a file, exactly as for any other reader: warm
needs no interface of its own.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from blobmount.warm.budget import CacheView, Ledger, Mode, Sizer, fits
from blobmount.warm.monitor import POLL_S, Monitor, StatsReader, WarmAborted, alloc_unit
from blobmount.warm.reading import Failure, Walker, each_block_backwards, read_through
from blobmount.warm.targets import WarmFile

log = logging.getLogger(__name__)

#: how long the end waits for the disk writer's queue to empty
DRAIN_TIMEOUT_S = 600.0
DEFAULT_JOBS = 16


class Interrupted(BaseException):  # a BaseException, like the KeyboardInterrupt it stands for
    """Raised in the main thread by a SIGTERM handler; `args[0]` is the signal's name."""


class _Stopped(Exception):
    pass


class _Room(Enum):
    FITS = 1
    CACHED = 2  # does not need the room: already on disk
    FULL = 3


@dataclass(frozen=True, slots=True)
class Progress:
    files_listed: int
    bytes_listed: int
    listing_done: bool
    files_done: int
    bytes_done: int
    elapsed_s: float
    throttled: bool  # waiting for the daemon's disk writes to catch up


class ProgressSink(Protocol):
    def update(self, progress: Progress) -> None: ...


@dataclass(slots=True)
class WarmResult:
    mode: Mode
    first: CacheView  # the cache before warming
    last: CacheView  # and after
    files: int = 0
    bytes: int = 0
    found_cached: int = 0  # block mode: files found on disk at the limit, not read again
    seconds: float = 0.0
    too_large: list[str] = field(default_factory=list)  # files that alone would start pruning
    failures: list[Failure] = field(default_factory=list)
    cache_full: bool = False
    stopped_before: str | None = None  # the first file left out because the cache is full
    interrupted: str | None = None  # the signal's name
    queue_left: int = 0  # blocks still queued for disk when warm gave up waiting

    @property
    def ok(self) -> bool:
        return not self.failures and self.interrupted is None and not self.queue_left


# -- the warm ----------------------------------------------------------------------------------


class Warmer:
    def __init__(
        self,
        root: str,
        targets: Sequence[str],
        read_stats: StatsReader,
        *,
        jobs: int = DEFAULT_JOBS,
        progress: ProgressSink | None = None,
    ) -> None:
        """Raises NoDiskCache (the mount caches nothing on disk), WarmAborted."""
        try:
            first = CacheView.from_snapshot(read_stats())
        except OSError as exc:
            raise WarmAborted(f"the mount does not answer ({exc.strerror or exc})") from None
        self.sizer = Sizer.for_view(first, alloc_unit(first.cache_dir))
        self.ledger = Ledger(self.sizer)
        self.monitor = Monitor(read_stats, first, self.ledger)
        self.jobs = max(1, jobs)
        self.result = WarmResult(first.mode, first, first)
        self._stop = threading.Event()
        self._walker = Walker(root, targets, self._stop)
        self._sink = progress
        self._lock = threading.Lock()
        self._futures: set[cf.Future[None]] = set()
        self._read_bytes = 0  # by the readers so far, finished files or not
        self._started = time.monotonic()

    def progress(self) -> Progress:
        r, w = self.result, self._walker
        return Progress(
            w.files,
            w.bytes,
            w.done,
            r.files,
            self._read_bytes,
            time.monotonic() - self._started,
            not self.monitor.gate.is_set(),
        )

    def run(self) -> WarmResult:
        """Warm every file listed, or until the cache is full or a signal arrives."""
        self._started = time.monotonic()
        self.monitor.start()
        self._walker.start()
        ticker = _Ticker(self._sink, self.progress)
        try:
            with cf.ThreadPoolExecutor(self.jobs, thread_name_prefix="warm-read") as pool:
                try:
                    self._warm(pool)
                except (KeyboardInterrupt, Interrupted) as exc:
                    name = exc.args[0] if isinstance(exc, Interrupted) else "SIGINT"
                    self.result.interrupted = name
                    log.info("%s: stopping after the reads in progress", name)
                finally:
                    self._stop.set()  # readers stop at their next read, the walker at once
        finally:
            ticker.close()
            self.monitor.close()
        self.result.seconds = time.monotonic() - self._started
        self.result.failures[:0] = self._walker.errors
        self.result.last = self.monitor.refresh()[0]
        return self.result

    def _warm(self, pool: cf.ThreadPoolExecutor) -> None:
        for item in self._walker.items(self._check):
            cost = self.sizer.cost(item.size)
            if cost >= self.monitor.current()[0].prune_start_bytes:
                self.result.too_large.append(item.rel)
                continue
            while len(self._futures) >= self.jobs:
                self._wait(cf.FIRST_COMPLETED)
            room = self._room_for(item, cost)
            if room is _Room.CACHED:
                self.result.found_cached += 1
                continue
            if room is _Room.FULL:
                self.result.cache_full = True
                self.result.stopped_before = item.rel
                break
            ticket = self.ledger.start(item.size)
            self._futures.add(pool.submit(self._warm_one, item, ticket))
        self._settle()

    def _room_for(self, item: WarmFile, cost: int) -> _Room:
        view, pending = self.monitor.current()
        if fits(self.sizer.usage(view), pending, cost, view.prune_start_bytes):
            return _Room.FITS
        view, pending = self.monitor.refresh()
        if fits(self.sizer.usage(view), pending, cost, view.prune_start_bytes):
            return _Room.FITS
        # so close to the limit that the estimates matter: decide on exact figures
        self._settle()
        view, pending = self.monitor.refresh()
        if fits(self.sizer.usage(view), pending, cost, view.prune_start_bytes):
            return _Room.FITS
        return _Room.CACHED if self._cached_already(item, view, pending) else _Room.FULL

    def _cached_already(self, item: WarmFile, view: CacheView, pending: int) -> bool:
        """Block mode, at the limit, nothing in flight: is all of `item` on disk already (as on
        a rerun)? Worth knowing, so that a rerun skips what is cached instead of stopping.

        One byte of each block is read, last block first, and the daemon's stats looked at
        after each: a storage request means that block was missing, and the answer is no. Such
        reads start no read-ahead (only a read forward does), so the check brings at most the
        one missing block, and it is made only when that block fits."""
        if view.mode is not Mode.BLOCKS or item.size == 0:
            return False
        if not fits(
            self.sizer.usage(view),
            pending,
            self.sizer.cost(min(item.size, view.block_size)),
            view.prune_start_bytes,
        ):
            return False
        try:
            for _ in each_block_backwards(item.path, view.block_size):
                if self.monitor.refresh()[0].storage_requests != view.storage_requests:
                    return False
        except OSError:
            return False
        return True

    def _settle(self) -> None:
        """Wait for the readers, then (block mode) for their blocks to be on disk."""
        while self._futures:
            self._wait(cf.ALL_COMPLETED)
        if self.result.mode is not Mode.BLOCKS:
            return
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while (queued := self.monitor.refresh()[0].queued_blocks) > 0:
            if time.monotonic() > deadline:
                log.warning(
                    "%d blocks still queued for the disk after %.0fs", queued, DRAIN_TIMEOUT_S
                )
                self.result.queue_left = queued
                return
            time.sleep(POLL_S / 2)

    def _wait(self, how: str) -> None:
        done, self._futures = cf.wait(self._futures, timeout=POLL_S, return_when=how)
        for future in done:
            future.result()  # a reader's own failures are recorded; anything else is a bug
        self._check()

    def _check(self) -> None:
        if self.monitor.error is not None:
            raise self.monitor.error

    def _warm_one(self, item: WarmFile, ticket: int) -> None:
        last = 0

        def on_progress(covered: int) -> None:
            nonlocal last
            self.ledger.progress(ticket, covered)
            with self._lock:
                self._read_bytes += covered - last
            last = covered

        def wait_turn() -> None:
            while not self.monitor.gate.wait(POLL_S):
                if self._stop.is_set():
                    raise _Stopped
            if self._stop.is_set():
                raise _Stopped

        try:
            n = read_through(
                item.path, on_progress, wait_turn, open_only=self.result.mode is Mode.WHOLE_FILE
            )
        except _Stopped:
            return
        except OSError as exc:
            with self._lock:
                self.result.failures.append(Failure(item.rel, exc.strerror or str(exc)))
            return
        finally:
            self.ledger.finish(ticket)
        with self._lock:
            self.result.files += 1
            self.result.bytes += n


class _Ticker:
    """Feeds a progress sink every few tenths of a second from its own thread."""

    INTERVAL_S = 0.25

    def __init__(self, sink: ProgressSink | None, read: Callable[[], Progress]) -> None:
        self._sink, self._read = sink, read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if sink is not None:
            self._thread = threading.Thread(target=self._run, name="warm-progress", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        assert self._sink is not None
        while not self._stop.wait(self.INTERVAL_S):
            self._sink.update(self._read())

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._sink is not None:
            self._sink.update(self._read())
