"""The whole-file cache's background writer: small copies fetched into memory are written to
their entries, checked, either in a worker thread (a batch per thread hop) or on the trio thread
while it would otherwise wait for the network.

Why a thread and batches: the FUSE loop's thread was the bottleneck of small-file reads, and
every system call made on it lets the storage client's loop thread take the GIL, for up to the
interpreter's switch interval (measured: a cold 25 KB file spent about 0.5 ms of that thread's
time in the Content-MD5 check, the temporary's creation, write and rename, done in place). A
thread hop per file costs about 90 µs of CPU; a batch shares one hop among the files whose
writes are waiting, which under load is most of them.

When nothing else is being fetched or written (one reader, say), the hop would cost more than it
saves, so the write is deferred (`defer`) and done on the trio thread, but not at once: creating,
writing and renaming a file takes 0.2-0.3 ms of that thread's time, and a reader that has just
been answered sends its next request (read, close, the next open) right away, which would wait
for it. A deferred write is done once the next download has handed its GET to the storage client
(`kick`) and the trio thread has nothing else to run: it then overlaps that GET's round trip. If
no GET comes, it is done after `DEFER_MAX_S`, or at once when someone waits for `settled()`.

The bytes handed here were checked against the blob's Content-MD5 already (`fetch.fetch_whole`),
so an entry is only ever written from checked bytes, through a temporary renamed into place
(`entries.put_entry`). `settled()` waits until every write submitted or deferred so far has
landed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import trio
import trio.testing

from blobmount.wholefile import entries

log = logging.getLogger(__name__)

#: writes handed to one thread call at most (bounds how long a batch holds its thread)
MAX_BATCH = 64
#: a deferred write waits at most this long for the next GET, then at most as long again for a
#: moment when the trio thread has nothing else to run
DEFER_MAX_S = 0.005


@dataclass(slots=True)
class EntryWrite:
    """One entry to write: where, and the (checked) bytes."""

    path: str
    data: bytes
    #: set (on the trio thread) when the entry is no longer wanted before its write starts
    cancelled: bool = False
    #: the outcome, set when it has landed: "written", "failed" or "skipped"
    outcome: str = ""
    error: OSError | None = None
    #: what it is written for (the cache's own record)
    owner: object = field(default=None, repr=False)


def write_batch(batch: list[EntryWrite]) -> None:
    """(worker thread) Write each entry of `batch`, setting its outcome."""
    for item in batch:
        if item.cancelled:
            item.outcome = "skipped"
            continue
        try:
            entries.put_entry(item.path, item.data)
        except OSError as exc:
            item.outcome, item.error = "failed", exc
        else:
            item.outcome = "written"


class EntryWriter:
    """Writes entries: `submit`ted ones by `write_batch` in worker threads (`limiter`),
    `defer`red ones on the trio thread (see the module docstring). `landed(item)` is called on
    the trio thread for each item once it is done. `run` is the writer's task."""

    def __init__(
        self,
        limiter: trio.CapacityLimiter,
        landed: Callable[[EntryWrite], None],
        *,
        defer_max_s: float = DEFER_MAX_S,
    ) -> None:
        self._limiter = limiter
        self._landed = landed
        self._defer_max_s = defer_max_s
        self._queue: list[EntryWrite] = []
        self._wake = trio.Event()
        self._deferred: list[EntryWrite] = []
        self._deferred_wake = trio.Event()
        #: set when a GET has just been handed to storage (or someone waits for `settled`)
        self._go = trio.Event()
        self._in_flight = 0
        self._idle = trio.Event()
        self._idle.set()

    @property
    def busy(self) -> bool:
        """Writes are queued, deferred or in flight."""
        return bool(self._queue or self._deferred or self._in_flight)

    def submit(self, item: EntryWrite) -> None:
        """Queue `item` for the next batch in a worker thread."""
        self._queue.append(item)
        self._not_idle()
        self._wake.set()

    def defer(self, item: EntryWrite) -> None:
        """Write `item` on the trio thread while it waits for the next GET (or soon anyway):
        for when nothing else is being fetched or written, and nobody waits for the write."""
        self._deferred.append(item)
        self._not_idle()
        self._deferred_wake.set()

    def kick(self) -> None:
        """(called just before a GET is handed to storage) Deferred writes go now: the trio
        thread is about to wait for the network."""
        if self._deferred:
            self._go.set()

    def _not_idle(self) -> None:
        if self._idle.is_set():
            self._idle = trio.Event()

    def _idle_if_done(self) -> None:
        if not self._queue and not self._deferred and not self._in_flight:
            self._idle.set()

    async def settled(self) -> None:
        """Wait until every write submitted or deferred so far has landed."""
        self.kick()
        await self._idle.wait()

    async def run(self) -> None:
        """Write until cancelled; then write what is still queued or deferred (shielded: the
        bytes are checked and here, and each write is short)."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._run_batches)
                nursery.start_soon(self._run_deferred)
        finally:
            with trio.CancelScope(shield=True):
                self._write_deferred()
                await self._write_queued()

    async def _run_batches(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            await self._write_queued()

    async def _run_deferred(self) -> None:
        while True:
            await self._deferred_wake.wait()
            self._deferred_wake = trio.Event()
            with trio.move_on_after(self._defer_max_s):
                await self._go.wait()
            self._go = trio.Event()
            # the kick comes before the GET's own checkpoints: let its task reach the bridge
            # (and every other runnable task run) before taking the thread
            with trio.move_on_after(self._defer_max_s):
                await trio.testing.wait_all_tasks_blocked()
            self._write_deferred()

    def _write_deferred(self) -> None:
        """(trio thread) Write every deferred item here and now."""
        while self._deferred:
            batch, self._deferred = self._deferred, []
            self._in_flight += len(batch)
            try:
                write_batch(batch)
            finally:
                self._in_flight -= len(batch)
                self._land(batch)
        self._idle_if_done()

    async def _write_queued(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            self._in_flight += len(batch)
            try:
                # a batch taken is written whole, even at unmount
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(write_batch, batch, limiter=self._limiter)
            finally:
                self._in_flight -= len(batch)
                self._land(batch)
        self._idle_if_done()

    def _land(self, batch: list[EntryWrite]) -> None:
        for item in batch:
            if not item.outcome:
                item.outcome = "skipped"  # never written (the thread never ran, or it failed)
            self._landed(item)
