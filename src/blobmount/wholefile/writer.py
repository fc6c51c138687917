"""The whole-file cache's background writer: small copies fetched into memory are written to
their entries by one thread of its own, off the trio thread.

Why its own thread, and not the trio thread or a `trio.to_thread` hop per write: creating,
writing, closing and renaming a small file is four system calls, and each one releases the GIL.
Done on the trio thread, every release let the storage client's loop thread take the GIL, so
writing a 25 KB entry held up the FUSE loop for 0.3-0.4 ms (measured with py-spy, one reader:
the calls themselves take 0.04 ms), and one reader's files/s fell to 0.7x block mode's. A
`trio.to_thread` hop per write costs about 90 µs of the trio thread's CPU. Here the trio thread
only appends to a queue; the thread takes every write waiting (up to `MAX_BATCH`), writes them,
and hands the batch back in one `run_sync_soon`, so under load one wakeup lands many writes.

The bytes handed here were checked against the blob's Content-MD5 already (`fetch.fetch_whole`),
so an entry is only ever written from checked bytes, through a temporary renamed into place
(`entries.put_entry`). `settled()` waits until every write submitted so far has landed; at
unmount, what is queued is still written (each write is short).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from blobmount.wholefile import entries

log = logging.getLogger(__name__)

#: writes taken by the thread at once at most (bounds how long a batch waits to land)
MAX_BATCH = 64

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


def write_batch(batch: list[EntryWrite]) -> None:
    """(writer thread) Write each entry of `batch`, setting its outcome."""
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
    """Writes `submit`ted entries in a thread of its own (see the module docstring);
    `landed(item)` is called on the trio thread for each once it is done. `run` is the writer's
    task: it starts the thread and, when cancelled, lets it write what is queued and stop."""

    def __init__(self, landed: Callable[[EntryWrite], None]) -> None:
        self._landed = landed
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        #: submitted and not yet landed
        self._pending = 0
        self._idle = trio.Event()
        self._idle.set()

    @property
    def busy(self) -> bool:
        """Writes are queued or being written."""
        return self._pending > 0

    def submit(self, item: EntryWrite) -> None:
        """(trio thread) Queue `item`; it is written soon, in the writer's thread."""
        if self._idle.is_set():
            self._idle = trio.Event()
        self._pending += 1
        self._queue.put(item)

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
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await self.settled()
                self._queue.put(_STOP)
                await trio.to_thread.run_sync(thread.join)

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
                token.run_sync_soon(self._land, batch)
            if stop:
                return

    def _land(self, batch: list[EntryWrite]) -> None:
        """(trio thread) A batch is done: tell the cache about each write."""
        for item in batch:
            if not item.outcome:
                item.outcome = "skipped"  # never written (the thread failed)
            self._pending -= 1
            self._landed(item)
        if self._pending == 0:
            self._idle.set()
