"""AsyncioBridge: an asyncio event loop on its own daemon thread, awaited from trio.

The filesystem runs on trio (pyfuse3), the Azure SDK's async client on asyncio (aiohttp). The
bridge keeps the two worlds apart: every SDK object is created and used on the bridge's loop, and
trio code awaits `bridge.run(fn)` without ever blocking the trio thread.

Per call the cost is one `run_coroutine_threadsafe` (a wake-up of the asyncio loop) and one
`run_sync_soon` (a wake-up of trio) -- a few tens of microseconds, small next to a 2 MiB GET.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

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
        # futures of calls in flight, so close() can wake their waiters if the loop dies first
        self._pending: set[concurrent.futures.Future[Any]] = set()

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
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()

        def wake(_: concurrent.futures.Future[T]) -> None:
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass  # trio is gone; nobody is waiting any more

        fut = self._submit(fn)
        fut.add_done_callback(wake)
        try:
            await done.wait()
        except BaseException:
            # trio.Cancelled (or KeyboardInterrupt): stop the work on the asyncio side too
            fut.cancel()
            raise
        try:
            return fut.result()
        except concurrent.futures.CancelledError:
            # not cancelled by us (we would not be here): the loop went away under the call
            raise BridgeClosedError("asyncio bridge closed while a call was in progress") from None

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
