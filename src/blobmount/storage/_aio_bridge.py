"""AsyncioBridge: an asyncio event loop on its own daemon thread, awaited from trio.

The filesystem runs on trio (pyfuse3), the Azure SDK's async client on asyncio (aiohttp). The
bridge keeps the two worlds apart: every SDK object is created and used on the bridge's loop, and
trio code awaits `bridge.run(fn)` without ever blocking the trio thread.

A call crosses twice: to the loop and back. Both ways go through a queue whose other side is
woken once per batch (`_start_calls` on the loop, `_Mailbox._deliver` on trio), not once per
call, and a waiting trio task is rescheduled directly rather than through an Event and a
concurrent.futures.Future. Small-file reads make a call per file: with a cheaper prefetch slot
(blocks/fetcher.py), this saved about 4% of the daemon's CPU per hinted file
(docs/BENCHMARKING.md).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Generic, TypeVar

import outcome
import trio

log = logging.getLogger(__name__)

T = TypeVar("T")

#: how long close() waits for leftover asyncio tasks to unwind after cancelling them
_SHUTDOWN_GRACE_S = 5.0


class BridgeClosedError(RuntimeError):
    """The bridge was closed (or never started) before the call could finish."""


class AsyncioBridge:
    """Runs an asyncio loop on a daemon thread; `run()` awaits coroutines on it from trio.

    Usage::

        with AsyncioBridge() as bridge:          # or bridge.start() ... bridge.close()
            data = await bridge.run(lambda: client.fetch())

    `close()` stops the loop (cancelling whatever still runs on it), joins the thread and wakes
    every trio caller still waiting with BridgeClosedError. It is idempotent.
    """

    def __init__(self, name: str = "blobmount-asyncio") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # guards the started/closed state against run() racing with close()
        self._lock = threading.Lock()
        self._closed = False
        # futures of run_blocking() calls in flight, so close() can wake their waiters if the
        # loop dies first; run() calls likewise
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._calls: set[_Call[Any]] = set()
        # run() calls not started yet; the loop is woken once per batch (see _start_calls)
        self._inbox: collections.deque[_Call[Any]] = collections.deque()
        self._inbox_armed = False

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> AsyncioBridge:
        """Start the loop thread (once). Returns self."""
        with self._lock:
            if self._closed:
                raise BridgeClosedError("asyncio bridge already closed")
            if self._thread is not None:
                return self
            loop = asyncio.new_event_loop()
            ready = threading.Event()
            thread = threading.Thread(
                target=self._thread_main, args=(loop, ready), name=self._name, daemon=True
            )
            thread.start()
            ready.wait()
            self._loop = loop
            self._thread = thread
        return self

    def close(self) -> None:
        """Stop the loop and join its thread. Safe to call more than once, and before start()."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if threading.current_thread() is thread:
            raise RuntimeError("AsyncioBridge.close() called from its own loop thread")
        try:
            loop.call_soon_threadsafe(loop.stop)
        except RuntimeError:
            pass  # loop already closed
        thread.join()
        # anything the loop never got to (or that was cancelled on the way down) wakes up now
        for fut in list(self._pending):
            fut.cancel()
        self._pending.clear()
        closed = outcome.Error(
            BridgeClosedError("asyncio bridge closed while a call was in progress")
        )
        for call in list(self._calls):
            self._finished(call, closed)

    def __enter__(self) -> AsyncioBridge:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The bridge's loop (only touch it via call_soon_threadsafe & co. from other threads)."""
        if self._loop is None:
            raise BridgeClosedError("asyncio bridge not started")
        return self._loop

    @property
    def closed(self) -> bool:
        return self._closed

    def _thread_main(self, loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
            loop.run_until_complete(_cancel_leftovers())
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        except Exception:
            log.exception("asyncio bridge loop failed while shutting down")
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    # -- calls ---------------------------------------------------------------------------

    def _submit(self, fn: Callable[[], Awaitable[T]]) -> concurrent.futures.Future[T]:
        async def call() -> T:
            # fn() itself runs on the loop thread, so it may create SDK objects
            return await fn()

        with self._lock:
            if self._closed or self._loop is None:
                raise BridgeClosedError(
                    "asyncio bridge is closed" if self._closed else "asyncio bridge not started"
                )
            fut = asyncio.run_coroutine_threadsafe(call(), self._loop)
            self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)
        return fut

    async def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run `fn()` on the asyncio loop and return its result (or raise its exception).

        Called from trio; the trio thread is never blocked. If the trio task is cancelled the
        asyncio task is cancelled too and trio.Cancelled propagates.
        """
        call = _Call(fn, trio.lowlevel.current_task(), _mailbox())
        with self._lock:
            loop = self._loop
            if self._closed or loop is None:
                raise BridgeClosedError(
                    "asyncio bridge is closed" if self._closed else "asyncio bridge not started"
                )
            self._calls.add(call)
            self._inbox.append(call)
            if not self._inbox_armed:
                self._inbox_armed = True
                try:
                    loop.call_soon_threadsafe(self._start_calls)
                except RuntimeError:  # the loop thread died under us
                    self._inbox_armed = False
                    self._inbox.pop()
                    self._calls.discard(call)
                    raise BridgeClosedError("asyncio bridge loop is gone") from None

        def abort(_: Any) -> trio.lowlevel.Abort:
            call.abandoned = True
            self._calls.discard(call)
            try:
                loop.call_soon_threadsafe(call.cancel)
            except RuntimeError:
                pass  # the loop is closed, and the call with it
            return trio.lowlevel.Abort.SUCCEEDED

        result: T = await trio.lowlevel.wait_task_rescheduled(abort)
        return result

    def _start_calls(self) -> None:
        """(loop thread) Start every call queued since the last time: one wake-up per batch."""
        self._inbox_armed = False
        inbox = self._inbox
        while inbox:
            call = inbox.popleft()
            if not call.abandoned:
                call.start(self)

    def _finished(self, call: _Call[Any], result: outcome.Outcome[Any]) -> None:
        self._calls.discard(call)
        call.mailbox.post(call, result)

    def run_blocking(self, fn: Callable[[], Awaitable[T]], timeout: float | None = None) -> T:
        """Run `fn()` on the loop and block this (non-trio, non-loop) thread for the result."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("run_blocking() called from the bridge's own loop thread")
        fut = self._submit(fn)
        try:
            return fut.result(timeout)
        except concurrent.futures.CancelledError:
            raise BridgeClosedError("asyncio bridge closed while a call was in progress") from None


async def _cancel_leftovers() -> None:
    """Cancel every task still on the loop and give them a moment to unwind."""
    me = asyncio.current_task()
    for _ in range(3):  # cancellation can spawn cleanup tasks; a few rounds catch those
        tasks = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        if not tasks:
            return
        for task in tasks:
            task.cancel()
        _, still = await asyncio.wait(tasks, timeout=_SHUTDOWN_GRACE_S)
        if still:
            log.warning("%d asyncio task(s) did not finish after cancellation", len(still))
            return


class _Mailbox:
    """Results of bridge calls on their way back to one trio run: the asyncio thread posts, and
    trio is woken once per batch rather than once per result."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._results: collections.deque[tuple[_Call[Any], outcome.Outcome[Any]]] = (
            collections.deque()
        )
        self._armed = False

    def post(self, call: _Call[Any], result: outcome.Outcome[Any]) -> None:
        """(any thread) Hand `result` to the trio task waiting in `call`, once."""
        if call.posted:
            return
        call.posted = True
        self._results.append((call, result))
        if not self._armed:
            self._armed = True
            try:
                self._token.run_sync_soon(self._deliver)
            except trio.RunFinishedError:
                pass  # trio is gone; nobody is waiting any more

    def _deliver(self) -> None:
        # disarm first: a result posted from now on arms a new delivery, so none is left behind
        self._armed = False
        results = self._results
        while results:
            call, result = results.popleft()
            if not call.abandoned:
                trio.lowlevel.reschedule(call.task, result)


_MAILBOX: trio.lowlevel.RunVar[_Mailbox] = trio.lowlevel.RunVar("blobmount_bridge_mailbox")


def _mailbox() -> _Mailbox:
    try:
        return _MAILBOX.get()
    except LookupError:
        box = _Mailbox(trio.lowlevel.current_trio_token())
        _MAILBOX.set(box)
        return box


class _Call(Generic[T]):
    """One run() call: made on the trio thread, started and finished on the loop thread."""

    __slots__ = ("abandoned", "aio_task", "fn", "mailbox", "posted", "task")

    def __init__(
        self, fn: Callable[[], Awaitable[T]], task: trio.lowlevel.Task, mailbox: _Mailbox
    ) -> None:
        self.fn = fn
        self.task = task
        self.mailbox = mailbox
        self.aio_task: asyncio.Task[T] | None = None
        self.abandoned = False  # the trio side was cancelled and no longer waits
        self.posted = False

    def start(self, bridge: AsyncioBridge) -> None:
        """(loop thread)"""
        try:
            coro = self.fn()
            self.aio_task = task = asyncio.ensure_future(coro)
        except Exception as exc:
            bridge._finished(self, outcome.Error(exc))
            return
        task.add_done_callback(lambda t: bridge._finished(self, _result_of(t)))

    def cancel(self) -> None:
        """(loop thread) The trio side gave up: stop the work."""
        if self.aio_task is not None:
            self.aio_task.cancel()


def _result_of(task: asyncio.Task[T]) -> outcome.Outcome[T]:
    if task.cancelled():
        # not cancelled by the trio side (it no longer waits): the loop went away under the call
        return outcome.Error(
            BridgeClosedError("asyncio bridge closed while a call was in progress")
        )
    exc = task.exception()
    return outcome.Error(exc) if exc is not None else outcome.Value(task.result())
