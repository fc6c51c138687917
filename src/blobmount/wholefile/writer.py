"""The whole-file cache's background writer: small copies fetched into memory are checked and
written to their entries in a worker thread, a batch of them per thread hop.

Why a thread and batches: the FUSE loop's thread was the bottleneck of small-file reads, and
every system call made on it lets the storage client's loop thread take the GIL, for up to the
interpreter's switch interval (measured: a cold 25 KB file spent about 0.5 ms of that thread's
time in the Content-MD5 check, the temporary's creation, write and rename, done in place). A
thread hop per file costs about 90 µs of CPU; a batch shares one hop among the files whose
writes are waiting, which under load is most of them.

Each write checks the bytes against the blob's Content-MD5 (when it has one) first, so an
entry is only ever written from checked bytes, through a temporary renamed into place
(`entries.write_entry`). `settled()` waits until every write submitted so far has landed.
When nothing else is being fetched or written (one reader, or a quiet moment), a write is done
on the trio thread instead (`write_here`), once the open it served has been answered: then
the hop would cost more than it saves.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from blobmount.wholefile import entries

log = logging.getLogger(__name__)

#: writes handed to one thread call at most (bounds how long a batch holds its thread)
MAX_BATCH = 64


@dataclass(slots=True)
class EntryWrite:
    """One entry to write: where, the bytes, and the MD5 they must have (None: no check)."""

    path: str
    data: bytes
    md5: bytes | None
    #: set (on the trio thread) when the entry is no longer wanted before its write starts
    cancelled: bool = False
    #: the outcome, set when it has landed: "written", "corrupt", "failed" or "skipped"
    outcome: str = ""
    error: OSError | None = None
    #: what it is written for (the cache's own record)
    owner: object = field(default=None, repr=False)


def write_batch(batch: list[EntryWrite]) -> None:
    """(worker thread) Check and write each entry of `batch`, setting its outcome."""
    for item in batch:
        if item.cancelled:
            item.outcome = "skipped"
            continue
        if item.md5 is not None and not hmac.compare_digest(
            hashlib.md5(item.data).digest(), item.md5
        ):
            item.outcome = "corrupt"
            continue
        try:
            entries.put_entry(item.path, item.data)
        except OSError as exc:
            item.outcome, item.error = "failed", exc
        else:
            item.outcome = "written"


class EntryWriter:
    """Runs `write_batch` in worker threads (`limiter`) for whatever has been submitted;
    `landed(item)` is called on the trio thread for each item as its batch ends."""

    def __init__(self, limiter: trio.CapacityLimiter, landed: Callable[[EntryWrite], None]) -> None:
        self._limiter = limiter
        self._landed = landed
        self._queue: list[EntryWrite] = []
        self._wake = trio.Event()
        self._in_flight = 0
        self._idle = trio.Event()
        self._idle.set()

    @property
    def busy(self) -> bool:
        """Writes are queued or in flight."""
        return bool(self._queue or self._in_flight)

    def submit(self, item: EntryWrite) -> None:
        """Queue `item` for the next batch."""
        self._queue.append(item)
        self._not_idle()
        self._wake.set()

    async def write_here(self, item: EntryWrite) -> None:
        """Write `item` on this (the trio) thread, after the tasks runnable now have run:
        when nothing else is being fetched or written, the thread hop would cost more than
        the write, and nobody waits for it. Shielded, like a batch."""
        self._in_flight += 1
        self._not_idle()
        try:
            with trio.CancelScope(shield=True):
                # the opens woken with this copy come first: they run in the next batch of
                # tasks, and the second checkpoint puts this write after that batch
                await trio.lowlevel.checkpoint()
                await trio.lowlevel.checkpoint()
                write_batch([item])
        finally:
            self._in_flight -= 1
            if not item.outcome:
                item.outcome = "skipped"
            self._landed(item)
            self._idle_if_done()

    def _not_idle(self) -> None:
        if self._idle.is_set():
            self._idle = trio.Event()

    def _idle_if_done(self) -> None:
        if not self._queue and not self._in_flight:
            self._idle.set()

    async def settled(self) -> None:
        """Wait until every write submitted so far has landed."""
        await self._idle.wait()

    async def run(self) -> None:
        """Write batches until cancelled; then write what is still queued (shielded: the
        bytes are checked and here, and each write is short)."""
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                await self._write_queued()
        finally:
            with trio.CancelScope(shield=True):
                await self._write_queued()

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
                for item in batch:
                    if not item.outcome:
                        item.outcome = "skipped"  # the thread never ran (cancelled first)
                    self._landed(item)
        self._idle_if_done()
