"""Route 2's handoff: a trio process asks worker processes for read payloads and gets them back
through shared memory, notified on a socketpair.

The FUSE side sends (slot, inode, offset, size) to a worker; the worker writes the payload into
that slot of an mmap of an O_TMPFILE in /dev/shm and replies (slot, length); a receiver task in
trio sets the slot's `trio.Event`, and the handler returns a memoryview of the slot, which
pyfuse3's `fuse_reply_buf` copies into the kernel (Python makes no copy). Used by
`multifs.py --handoff-workers` and `handoff_bench.py`.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import socket
import struct

import trio

from multiproc.content import big_bytes, big_inode, small_bytes

SLOT_BYTES = 1 << 20
SLOTS = 32
#: request: slot, inode, offset, size
REQUEST = struct.Struct("=IQQI")
#: reply: slot, length
REPLY = struct.Struct("=II")


def _worker(sock: socket.socket, view: memoryview, files: int, file_size: int) -> None:
    """A worker process: for each request, write the payload into its slot, then notify."""
    pending = bytearray()
    while True:
        data = sock.recv(REQUEST.size * 64)
        if not data:
            return
        pending += data
        replies = []
        while len(pending) >= REQUEST.size:
            slot, inode, offset, size = REQUEST.unpack_from(pending)
            del pending[: REQUEST.size]
            if inode == big_inode(files):
                payload = big_bytes(offset, size, 1 << 62)
            else:
                payload = small_bytes(inode - 2, offset, size, file_size)
            view[slot * SLOT_BYTES : slot * SLOT_BYTES + len(payload)] = payload
            replies.append(REPLY.pack(slot, len(payload)))
        sock.sendall(b"".join(replies))


class HandoffError(OSError):
    """No free slot (more reads in flight than SLOTS)."""


class Handoff:
    """The trio side of route 2: slots in a shared mmap, one socketpair per worker process.

    Create it before any thread or trio run exists (it forks the workers); `close()` ends and
    reaps them.
    """

    def __init__(self, workers: int, files: int, file_size: int) -> None:
        self._fd = os.open("/dev/shm", os.O_TMPFILE | os.O_RDWR, 0o600)
        os.ftruncate(self._fd, SLOT_BYTES * SLOTS)
        self._map = mmap.mmap(self._fd, SLOT_BYTES * SLOTS)
        self._view = memoryview(self._map)
        self._socks: list[socket.socket] = []
        self.pids: list[int] = []
        for _ in range(workers):
            ours, theirs = socket.socketpair()
            pid = os.fork()
            if pid == 0:  # the worker: never returns into the caller's code
                status = 0
                try:
                    ours.close()
                    for sock in self._socks:
                        sock.close()
                    _worker(theirs, self._view, files, file_size)
                except BaseException:
                    status = 1
                finally:
                    os._exit(status)
            theirs.close()
            ours.setblocking(False)
            self._socks.append(ours)
            self.pids.append(pid)
        self._free = list(range(SLOTS))
        self._length = [0] * SLOTS
        self._events: list[trio.Event | None] = [None] * SLOTS
        self._next = 0

    async def run_receivers(self) -> None:
        """Receive the workers' replies (run for as long as reads may be handed off)."""
        async with trio.open_nursery() as nursery:
            for sock in self._socks:
                nursery.start_soon(self._receive, sock)

    async def _receive(self, sock: socket.socket) -> None:
        pending = b""
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            if not data:
                return
            pending += data
            whole = len(pending) // REPLY.size
            for i in range(whole):
                slot, length = REPLY.unpack_from(pending, i * REPLY.size)
                self._length[slot] = length
                event = self._events[slot]
                if event is not None:
                    event.set()
            pending = pending[whole * REPLY.size :]

    async def fetch(self, inode: int, offset: int, size: int, file_size: int) -> memoryview:
        """The payload of one read, as a view of its slot (valid until the caller's handler
        returns: pyfuse3 copies it into the kernel before any other task runs)."""
        size = max(0, min(size, file_size - offset))
        if not self._free:
            raise HandoffError(errno.EBUSY, "no free handoff slot")
        slot = self._free.pop()
        event = self._events[slot] = trio.Event()
        sock = self._socks[self._next]
        self._next = (self._next + 1) % len(self._socks)
        sock.send(REQUEST.pack(slot, inode, offset, size))
        await event.wait()
        # the slot is free again at once: a worker writes it only after another task has sent
        # it a new request, which cannot happen before pyfuse3 has replied from this view
        self._free.append(slot)
        return self._view[slot * SLOT_BYTES : slot * SLOT_BYTES + self._length[slot]]

    def close(self) -> None:
        for sock in self._socks:
            sock.close()
        for pid in self.pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        # a view handed to pyfuse3 may still be alive: then the map goes with the process
        with contextlib.suppress(BufferError):
            self._view.release()
            self._map.close()
        os.close(self._fd)
