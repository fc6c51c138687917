"""The daemon's live figures while warming: its stats, polled in the background and read on
demand, and the gate that pauses warm's readers while the disk writer's queue is over half
full."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from blobmount.cachedir.layout import free_bytes
from blobmount.errors import BlobmountError
from blobmount.warm.budget import DEFAULT_ALLOC_UNIT, CacheView, Ledger, Mode

if TYPE_CHECKING:
    from blobmount.snapshot import MountSnapshot

#: how often the daemon's stats are read while warming
POLL_S = 0.1

#: reads the daemon's stats (blocking); raises OSError once the mount stops answering
StatsReader = Callable[[], "MountSnapshot"]


class WarmAborted(BlobmountError):
    """The mount stopped answering while warming."""


class Monitor:
    """The daemon's stats, read on demand and every POLL_S in the background, and the gate
    readers wait on while the disk writer's queue is more than half full (a block that meets a
    full queue is dropped, not cached)."""

    def __init__(self, read_stats: StatsReader, first: CacheView, ledger: Ledger) -> None:
        self._read_stats = read_stats
        self._ledger = ledger
        self._view = first
        self._fetch_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="warm-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def current(self) -> tuple[CacheView, int]:
        """The last snapshot and what warm added since, consistently."""
        with self._state_lock:
            return self._view, self._ledger.pending()

    def refresh(self) -> tuple[CacheView, int]:
        with self._fetch_lock:
            mark = self._ledger.mark()  # before asking: the answer holds at least this much
            try:
                view = CacheView.from_snapshot(self._read_stats())
            except OSError as exc:
                raise WarmAborted(f"the mount stopped answering ({exc.strerror or exc})") from None
            with self._state_lock:
                self._ledger.settle(mark)
                self._view = view
            if view.mode is Mode.BLOCKS and view.queue_over_half:
                self.gate.clear()
            else:
                self.gate.set()
            return self.current()

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.refresh()
            except BaseException as exc:
                self.error = exc
                self.gate.set()  # readers must not wait for a monitor that is gone
                return


def alloc_unit(cache_dir: str) -> int:
    try:
        return free_bytes(Path(cache_dir))[1]
    except OSError:  # not ours to look at (another user's mount): the usual unit
        return DEFAULT_ALLOC_UNIT
