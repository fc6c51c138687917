"""Read-order hints: fetch the files a job says it will read next, a bounded window ahead of it.

A *stream* is one ordered list of paths from one client (one connection to the hint socket: a
sampler in the training process, or one data-loader worker). For each stream:

- Received paths wait in a queue of at most `max_queued` hints. While it is full the stream's
  socket is not read, so a client that writes faster than the job reads is slowed down, never
  buffered without end.
- A task takes hints in order, resolves each path to a blob version (through the mount's
  metadata cache, as a lookup would), and has the prefetcher fetch the file's first blocks
  into the hinted store (`blocks/hinted.py`). At most `window` files of a stream are *ahead*:
  fetched or being fetched, not opened yet. The task waits when the window or the hinted store
  is full.
- When the job opens a hinted file, the file leaves the window (*used*). Hints of the same stream
  still queued up to that one are dropped (*late*: the job got there first, fetching them now
  would only duplicate its reads), and fetched files more than `REORDER_SLACK` hints behind it
  are given up (*wasted*): data loaders read a little out of order, not far out of order.
- When a stream's connection closes (a client may send a whole epoch and go), its hints are
  still acted on, until the job has opened none of its files for `GRACE_S`; then the rest is
  given up.

With several processes (DATASET_MOUNT_WORKER_PROCESSES) only the main process has a coordinator
that gets hints; it records the names of the blobs it has hints for (queued or ahead) in a set
all the processes read (`published`, multiproc/hinted_names.py), so that an open of one of them
landing in another process is passed to it (fs/forward.py): it finds the blocks, and the
coordinator sees the open.

Hints are advisory: a wrong or stale hint costs bandwidth and hinted-store memory (both bounded),
never a wrong byte, because reads always go through the block manager with the version the
open pinned.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import trio

from blobmount.blocks.keys import BlobVersion

log = logging.getLogger(__name__)

#: hints behind the newest opened one that may still be opened (data-loader reordering)
REORDER_SLACK = 64
#: how long a closed stream's files may go unopened before the rest of it is given up
GRACE_S = 30.0


class Prefetcher(Protocol):
    """Where hinted files are fetched to (the block manager in block mode)."""

    def fetch_hinted(
        self,
        version: BlobVersion,
        max_blocks: int,
        wanted: Callable[[], bool],
        landed: Callable[[bool], None],
    ) -> int | None: ...

    def drop_hinted(self, version: BlobVersion) -> int: ...


class NameSet(Protocol):
    """Where the names of the blobs with hints queued or ahead are published."""

    def add(self, name: str) -> None: ...

    def discard(self, name: str) -> None: ...


#: resolves a mount-relative path to the version an open would pin now (None: not a file)
Resolver = Callable[[str], Awaitable[BlobVersion | None]]


@dataclass(frozen=True, slots=True)
class HintConfig:
    window: int  # files ahead per stream (DATASET_MOUNT_HINT_WINDOW)
    #: the first blocks of each hinted file that are fetched (a small file is all of it)
    blocks_per_file: int = 4
    max_queued: int = 0  # 0: 4 x window

    @property
    def queue_limit(self) -> int:
        return self.max_queued or 4 * self.window


@dataclass(frozen=True, slots=True)
class HintStats:
    streams: int
    received: int
    invalid: int  # paths that are not files of the mount
    fetched: int  # hinted files whose blocks all arrived
    used: int  # hinted files the job opened after their fetch started
    late: int  # hints dropped because the job opened the file (or a later one) first
    wasted: int  # files fetched for hints and given up unopened
    ahead: int  # files fetched or being fetched, not opened yet (all streams)
    queued: int  # hints received, not yet acted on (all streams)


class _Hint:
    __slots__ = ("blob", "path", "pending", "seq", "state", "stream", "version")

    def __init__(self, stream: HintStream, seq: int, path: str, blob: str) -> None:
        self.stream = stream
        self.seq = seq
        self.path = path
        self.blob = blob
        self.version: BlobVersion | None = None
        self.pending = 0  # blocks still being fetched
        self.state = "queued"  # -> "ahead" -> "used" -> "closed", or "wasted"; or "late"


class HintStream:
    """One client's ordered hints. Made by `HintCoordinator.open_stream`."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.queue: deque[_Hint] = deque()
        #: seq -> hint, in seq order (hints start in queue order; `opened` relies on it)
        self.ahead: dict[int, _Hint] = {}
        self.newest_opened = -1
        self.closed = False
        #: what the stream's task is waiting for, if it waits: a hint in the queue ("hints"), a
        #: file of the window opened ("window") or room in the hinted store ("room"). Events
        #: wake it only for what it waits for: every file read gives room back, and waking the
        #: task for each would cost a task switch per file for nothing.
        self.waiting_for: str | None = None
        self._task_event = trio.Event()
        self._queue_event = trio.Event()  # the receiver waits for room in the queue

    def wake_task(self, *reasons: str) -> None:
        """Wake the stream's task if it waits for one of `reasons` (any reason: none given)."""
        if self.waiting_for is not None and (not reasons or self.waiting_for in reasons):
            self.waiting_for = None
            self._task_event.set()
            self._task_event = trio.Event()

    async def task_wait(self, reason: str) -> None:
        self.waiting_for = reason
        try:
            await self._task_event.wait()
        finally:
            self.waiting_for = None

    def queue_shrank(self) -> None:
        self._queue_event.set()
        self._queue_event = trio.Event()

    async def wait_for_queue_room(self) -> None:
        await self._queue_event.wait()


class HintCoordinator:
    def __init__(
        self,
        config: HintConfig,
        prefetcher: Prefetcher,
        resolve: Resolver,
        blob_prefix: str,
        published: NameSet | None = None,
    ) -> None:
        self.config = config
        self._published = published
        self._prefetcher = prefetcher
        self._resolve = resolve
        self._blob_prefix = blob_prefix
        self._streams: dict[int, HintStream] = {}
        self._numbers = itertools.count(1)
        self._seq = itertools.count()
        #: blob name -> hints of it that are queued or ahead (any stream)
        self._by_blob: dict[str, list[_Hint]] = {}
        #: blob name -> used hints whose file is still open (their blocks may still land)
        self._open: dict[str, _Hint] = {}
        self._received = 0
        self._invalid = 0
        self._fetched = 0
        self._used = 0
        self._late = 0
        self._wasted = 0

    # -- called by the hint server ---------------------------------------------------------

    def open_stream(self) -> HintStream:
        stream = HintStream(next(self._numbers))
        self._streams[stream.number] = stream
        return stream

    async def add(self, stream: HintStream, path: str) -> None:
        """Queue a hint (a path relative to the mount root); waits while the queue is full."""
        while len(stream.queue) >= self.config.queue_limit:
            await stream.wait_for_queue_room()
        hint = _Hint(stream, next(self._seq), path, self._blob_prefix + path)
        stream.queue.append(hint)
        hints = self._by_blob.get(hint.blob)
        if hints is None:
            hints = self._by_blob[hint.blob] = []
            if self._published is not None:
                self._published.add(hint.blob)
        hints.append(hint)
        self._received += 1
        stream.wake_task("hints")

    def invalid(self) -> None:
        self._invalid += 1

    def close_stream(self, stream: HintStream) -> None:
        """The client is gone; what it sent is still acted on (see `run_stream`)."""
        stream.closed = True
        stream.wake_task()

    def room_freed(self) -> None:
        """The hinted store gave room back: streams waiting for it may go on."""
        for stream in self._streams.values():
            stream.wake_task("room")

    # -- called by the filesystem ----------------------------------------------------------

    def opened(self, version: BlobVersion) -> None:
        hints = self._by_blob.get(version.name)
        if not hints:
            return
        hint = min(hints, key=lambda h: h.seq)  # the oldest hint of this name is being read
        stream = hint.stream
        stream.newest_opened = max(stream.newest_opened, hint.seq)
        if hint.state == "ahead":
            hint.state = "used"
            self._used += 1
            del stream.ahead[hint.seq]
            self._forget(hint)
            self._open[hint.blob] = hint
        # the job is at hint.seq: queued hints up to it are late
        while stream.queue and stream.queue[0].seq <= hint.seq:
            late = stream.queue.popleft()
            late.state = "late"
            self._late += 1
            self._forget(late)
        # far behind it: given up. `ahead` holds hints in the order they started, which is
        # their order in the stream, so the ones behind are at its front: the loop stops at the
        # first that is not (every open would otherwise walk the whole window)
        cutoff = hint.seq - REORDER_SLACK
        for old in list(itertools.takewhile(lambda h: h.seq < cutoff, stream.ahead.values())):
            self._give_up(old)
        stream.queue_shrank()
        if stream.closed:
            stream.wake_task()  # it times its grace period from the last open
        else:
            stream.wake_task("window")

    def closed(self, version: BlobVersion) -> None:
        """A file was closed: what is left of its hinted blocks will not be read through it."""
        hint = self._open.pop(version.name, None)
        if hint is not None:
            hint.state = "closed"  # blocks still in flight are not kept when they land
            self._prefetcher.drop_hinted(version)

    # -- the stream's task -----------------------------------------------------------------

    async def run_stream(self, stream: HintStream) -> None:
        """Act on the stream's hints. After its connection closes, the hints it sent are still
        acted on; once the job opens nothing of it for `GRACE_S`, what is left is given up."""
        try:
            while stream.queue or stream.ahead or not stream.closed:
                if not stream.closed:
                    await self._step(stream)
                    continue
                with trio.move_on_after(GRACE_S) as idle:
                    await self._step(stream)
                if idle.cancelled_caught:
                    break
        finally:
            for hint in list(stream.ahead.values()):
                self._give_up(hint)
            while stream.queue:
                self._forget(stream.queue.popleft())
            self._streams.pop(stream.number, None)

    async def _step(self, stream: HintStream) -> None:
        """Start the next hint, or wait for something to change."""
        if not stream.queue:
            await stream.task_wait("hints")
        elif len(stream.ahead) >= self.config.window:
            await stream.task_wait("window")
        elif not await self._start(stream.queue[0]):
            await stream.task_wait("room")

    async def _start(self, hint: _Hint) -> bool:
        """Fetch the hint at the head of its queue; False if the store has no room yet."""
        stream = hint.stream
        if hint.version is None:
            try:
                version = await self._resolve(hint.path)
            except Exception as exc:  # a hint must never hurt the mount
                log.debug("hint %r not resolved: %s", hint.path, exc)
                version = None
            if not stream.queue or stream.queue[0] is not hint:
                return True  # dropped meanwhile (late, or the stream closed)
            if version is None:
                self._invalid += 1
                stream.queue.popleft()
                stream.queue_shrank()
                self._forget(hint)
                return True
            hint.version = version
        version = hint.version

        def wanted() -> bool:
            return hint.state in ("ahead", "used")

        def landed(ok: bool) -> None:
            hint.pending -= 1
            if hint.pending == 0 and ok and hint.state != "wasted":
                self._fetched += 1

        started = self._prefetcher.fetch_hinted(
            version, self.config.blocks_per_file, wanted, landed
        )
        if started is None:
            return False
        stream.queue.popleft()
        stream.queue_shrank()
        hint.state = "ahead"
        hint.pending = started
        stream.ahead[hint.seq] = hint
        if started == 0:
            self._fetched += 1  # already at hand
        return True

    def _give_up(self, hint: _Hint) -> None:
        hint.state = "wasted"
        self._wasted += 1
        hint.stream.ahead.pop(hint.seq, None)
        self._forget(hint)
        if hint.version is not None:
            self._prefetcher.drop_hinted(hint.version)

    def _forget(self, hint: _Hint) -> None:
        hints = self._by_blob.get(hint.blob)
        if hints is None:
            return
        try:
            hints.remove(hint)
        except ValueError:
            return
        if not hints:
            del self._by_blob[hint.blob]
            if self._published is not None:
                self._published.discard(hint.blob)

    def statistics(self) -> HintStats:
        streams = self._streams.values()
        return HintStats(
            streams=len(self._streams),
            received=self._received,
            invalid=self._invalid,
            fetched=self._fetched,
            used=self._used,
            late=self._late,
            wasted=self._wasted,
            ahead=sum(len(s.ahead) for s in streams),
            queued=sum(len(s.queue) for s in streams),
        )
