"""Warm's reads through the mount, and the walker that lists what to read ahead of them."""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from blobmount.units import MiB
from blobmount.warm.monitor import POLL_S
from blobmount.warm.targets import WarmFile, walk

log = logging.getLogger(__name__)

#: one read asks for this much (the kernel splits it into FUSE requests); per reader thread
CHUNK = 2 * MiB
#: inside a large file, the page cache is given back this often, not only at its end
DROP_EVERY = 64 * MiB
#: files listed ahead of the readers (the rest of the tree waits: memory stays bounded)
WALK_AHEAD = 10_000


@dataclass(frozen=True, slots=True)
class Failure:
    path: str  # relative to the mount's root
    reason: str


_buffers = threading.local()


def read_through(
    path: str,
    on_progress: Callable[[int], None],
    wait_turn: Callable[[], None],
    open_only: bool = False,
) -> int:
    """Read the file at `path` to its end in large reads, giving its pages back to the kernel
    as it goes (warming must not fill the page cache). Returns the bytes read.

    `open_only` (whole-file mode): opening is what downloads the file into the cache, so
    reading it again would only copy it from the local disk."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if open_only:
            size = os.fstat(fd).st_size
            on_progress(size)
            return size
        buf = getattr(_buffers, "buf", None)
        if buf is None:
            buf = _buffers.buf = bytearray(CHUNK)
        done = dropped = 0
        while True:
            wait_turn()
            n = os.readv(fd, [buf])
            if n == 0:
                break
            done += n
            on_progress(done)
            if done - dropped >= DROP_EVERY:
                os.posix_fadvise(fd, dropped, done - dropped, os.POSIX_FADV_DONTNEED)
                dropped = done
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return done
    finally:
        os.close(fd)


def each_block_backwards(path: str, block_size: int) -> Iterator[int]:
    """Read one byte at the start of each block of the file at `path`, last block first;
    yields after each read. The page cache is dropped first, so each read reaches the mount."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        blocks = -(-os.fstat(fd).st_size // block_size)
        for index in reversed(range(blocks)):
            os.pread(fd, 1, index * block_size)
            yield index
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# -- the walk ----------------------------------------------------------------------------------


class Walker:
    """Lists the files under the targets in a thread, a bounded distance ahead of the readers."""

    def __init__(self, root: str, targets: Sequence[str], stop: threading.Event) -> None:
        self._root, self._targets, self._stop = root, targets, stop
        self._queue: queue.Queue[WarmFile | None] = queue.Queue(maxsize=WALK_AHEAD)
        self.files = 0
        self.bytes = 0
        self.done = False
        self.errors: list[Failure] = []
        self._thread = threading.Thread(target=self._run, name="warm-walk", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _on_error(self, rel: str, exc: OSError) -> None:
        self.errors.append(Failure(rel, f"cannot list: {exc.strerror or exc}"))

    def _put(self, item: WarmFile | None) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in walk(self._root, self._targets, self._on_error):
                self.files += 1
                self.bytes += item.size
                if not self._put(item):
                    return
        except Exception as exc:  # not a listing error (those are in `errors`): a bug
            log.exception("listing the files to warm failed")
            self.errors.append(Failure(".", f"listing stopped: {exc}"))
        finally:
            self.done = True
            self._put(None)

    def items(self, check: Callable[[], None]) -> Iterator[WarmFile]:
        """The files listed, in order; `check` runs while waiting for the next."""
        while True:
            try:
                item = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                check()
                continue
            if item is None:
                return
            yield item
