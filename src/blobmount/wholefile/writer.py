"""The whole-file cache's background writer: small copies fetched into memory are written to
their entries after the opens that wanted them were answered.

Where: on the trio thread while the disk answers fast, in a thread of its own otherwise.
Creating, writing, naming and closing a small file is four system calls, about 0.04 ms here.
While the storage client's requests ran on an asyncio thread, each of those calls let that
thread take the GIL, so a write on the trio thread held up the FUSE loop for 0.3-0.4 ms and the
writes went to this thread. That thread is gone (storage/http1.py), and the handoffs are now the
cost: with the writes in the thread, one reader of 25 KB files on the synthetic source cost the
daemon 1.17-1.36 ms of CPU per file, 0.76-1.00 ms with them in place (docs/developer-notes/
concurrency.md, "Whole-file entries"). A disk that stalls must not stall the FUSE loop, so an
`InlineReadGate` (the one the entry opens use) times each write in place and sends the writes to
the thread for a back-off once they turn slow. Either way the trio side only queues a write; the
writer task takes every write waiting and lands them together (`landed`, on the trio thread),
and the thread hands a batch back in one `run_sync_soon`.

In place, the writer task writes behind a GET: it waits until one of the cache's fetches is on
the wire (`fetching`) and then for a moment when no other task of the loop can run (trio's
`wait_all_tasks_blocked`: every request is waiting for storage or the kernel). A reader that
reads one file after another so finds file N's entry written while file N+1's GET is on the
wire, not in the gap between N's open being answered and N+1's open arriving: that gap looks
idle to the loop too, but the reader's next requests are on their way, and a write there is
added to each file's time (one reader against Azurite: 457 files/s with the writes there, 502
behind the GET, docs/developer-notes/concurrency.md). Under a load
that leaves the loop no such moment, or when no fetch follows, a batch waits at most
`MAX_DEFER_S` or until `MAX_DEFERRED` writes are queued (each holds its bytes in memory and its
room in the cache) and is written then.

The bytes handed here were checked against the blob's Content-MD5 already (`fetch.fetch_whole`),
so an entry is only ever written from checked bytes, and named only once whole
(`entries.put_entry`). `settled()` waits until every write submitted so far has landed; at
unmount, what is queued is still written (each write is short).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import trio
import trio.testing

from blobmount.blocks.inline_reads import InlineReadGate
from blobmount.wholefile import entries

log = logging.getLogger(__name__)

#: writes taken by the thread at once at most (bounds how long a batch waits to land)
MAX_BATCH = 64
#: how long writes in place wait for the loop to be idle, and how many may wait
MAX_DEFER_S = 0.05
MAX_DEFERRED = 64

#: tells the thread to stop (after the writes queued before it)
_STOP = object()


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


def write_one(item: EntryWrite) -> None:
    """Write `item`'s entry (unless cancelled), setting its outcome."""
    if item.cancelled:
        item.outcome = "skipped"
        return
    try:
        entries.put_entry(item.path, item.data)
    except OSError as exc:
        item.outcome, item.error = "failed", exc
    else:
        item.outcome = "written"


def write_batch(batch: list[EntryWrite]) -> None:
    """(writer thread) Write each entry of `batch`, setting its outcome."""
    for item in batch:
        write_one(item)


class EntryWriter:
    """Writes `submit`ted entries, in place while `gate` allows it, else in a thread of its own
    (see the module docstring); `landed(item)` is called on the trio thread for each once it is
    done. `run` is the writer's task: it starts the thread, writes in place what is queued for
    it and, when cancelled, writes what is queued and stops the thread."""

    def __init__(
        self, landed: Callable[[EntryWrite], None], gate: InlineReadGate | None = None
    ) -> None:
        self._landed = landed
        #: None: every write goes to the thread
        self.gate = gate
        #: (trio thread) queued for the writer task to write in place
        self._here: list[EntryWrite] = []
        self._wake = trio.Event()
        #: the writer task is ending: a write submitted now goes to the thread, which runs
        #: until everything submitted has landed
        self._stopping = False
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        #: submitted and not yet landed
        self._pending = 0
        self._idle = trio.Event()
        self._idle.set()
        #: entries written by the writer's thread (those written in place are the gate's)
        self.written_in_thread = 0
        #: the cache's fetches on the wire, and set when one starts (writes wait for one)
        self._fetches = 0
        self._fetch_started = trio.Event()

    @property
    def busy(self) -> bool:
        """Writes are queued or being written."""
        return self._pending > 0

    def submit(self, item: EntryWrite) -> None:
        """(trio thread) Queue `item`; it is written soon, by the writer task or its thread."""
        if self._idle.is_set():
            self._idle = trio.Event()
        self._pending += 1
        if not self._stopping and self.gate is not None and self.gate.allows(len(item.data)):
            self._here.append(item)
            self._wake.set()
        else:
            self._queue.put(item)

    @contextmanager
    def fetching(self) -> Iterator[None]:
        """(trio thread) Around one of the cache's fetches: writes in place go behind it."""
        self._fetches += 1
        self._fetch_started.set()
        try:
            yield
        finally:
            self._fetches -= 1

    async def settled(self) -> None:
        """Wait until every write submitted so far has landed."""
        await self._idle.wait()

    async def run(self) -> None:
        token = trio.lowlevel.current_trio_token()
        thread = threading.Thread(
            target=self._thread_main, args=(token,), name="blobmount-cache-writer", daemon=True
        )
        thread.start()
        try:
            while True:
                await self._wake.wait()
                await self._until_idle()
                self._wake = trio.Event()
                self._write_here()
        finally:
            self._stopping = True
            self._write_here()  # at unmount, what is queued is still written
            with trio.CancelScope(shield=True):
                await self.settled()
                self._queue.put(_STOP)
                await trio.to_thread.run_sync(thread.join)

    async def _until_idle(self) -> None:
        """Wait until a fetch is on the wire and no other task can run, `MAX_DEFER_S` at most,
        or not at all once `MAX_DEFERRED` writes are waiting (see the module docstring)."""
        if len(self._here) >= MAX_DEFERRED:
            return
        with trio.move_on_after(MAX_DEFER_S):
            while self._fetches == 0:
                self._fetch_started = trio.Event()
                await self._fetch_started.wait()
            await trio.testing.wait_all_tasks_blocked()

    def _thread_main(self, token: trio.lowlevel.TrioToken) -> None:
        while True:
            batch: list[EntryWrite] = []
            stop = False
            item = self._queue.get()
            while True:
                if item is _STOP:
                    stop = True
                else:
                    assert isinstance(item, EntryWrite)
                    batch.append(item)
                if stop or len(batch) >= MAX_BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                try:
                    write_batch(batch)
                except Exception:  # a bug: land the batch (as skipped) rather than hang
                    log.exception("whole-file cache: the entry writer failed")
                token.run_sync_soon(self._land_from_thread, batch)
            if stop:
                return

    def _write_here(self) -> None:
        """(trio thread) Write what is queued in place, each write timed for the gate; once the
        gate finds the disk slow, the rest go to the thread."""
        batch, self._here = self._here, []
        done: list[EntryWrite] = []
        for item in batch:
            gate = self.gate
            if gate is None or not gate.allows(len(item.data)):
                self._queue.put(item)
                continue
            started = time.monotonic()
            try:
                write_one(item)
            except Exception:  # a bug: land it (as skipped) rather than hang
                log.exception("whole-file cache: the entry writer failed")
            gate.record(time.monotonic() - started)
            done.append(item)
        if done:
            self._land(done)

    def _land_from_thread(self, batch: list[EntryWrite]) -> None:
        self.written_in_thread += len(batch)
        self._land(batch)

    def _land(self, batch: list[EntryWrite]) -> None:
        """(trio thread) A batch is done: tell the cache about each write."""
        for item in batch:
            if not item.outcome:
                item.outcome = "skipped"  # never written (the thread failed)
            self._pending -= 1
            self._landed(item)
        if self._pending == 0:
            self._idle.set()
