"""READs of a handle served by the process that opened it.

The kernel sends a handle's READs to whichever process of the mount reads the request first.
A process that did not open the handle could read the pinned version itself (it can: the
shared handle table says which version), but for a file of several blocks that means each
process fetches and reads ahead on its own: a large file read once was fetched about once per
process, and each process saw only part of the reader's stream. So such a READ is passed to
the opener over a Unix socket in the mount's shared folder and answered with the opener's
bytes: one read-ahead stream, one fetch per block.

Each process serves its own socket (`ReadServer`, named by its process index, so a worker's
replacement takes over its predecessor's handles) and keeps one connection to each other
process it has forwarded to (`ReadForwarder`). Requests on a connection are numbered and
answered in any order.

The bytes of an answer do not go through the socket: the forwarding process gives each
connection an *answer area* (`AnswerArea`, shared memory from `memfd_create`, its fd passed to
the opener once, when it connects), a READ names a free slot of it, the opener copies its bytes
into that slot and answers with their length, and the forwarding process hands the kernel a view
of the slot. Through the socket, a 1 MiB answer cost two more copies (into the kernel's socket
buffers and out again) and the allocations around them: a quarter of a 2-process mount's CPU
on a large file read sequentially. A slot is taken back when the READ returns (pyfuse3 copies
the view into its reply before any other task of this process runs, so before any other READ
can take the slot), and a slot whose READ was interrupted only when its answer has come, so a
late answer never lands in a slot another READ took. A READ larger than a slot, or one made
while every slot is taken, gets its bytes through the socket as before.

The same connection carries OPENs of a file the main process has read-order hints for
(multiproc/hinted_names.py): the main process opens it, with its hinted blocks and a handle
whose READs all come back to it, and the process that got the OPEN answers the kernel with
that handle.

A process that opens a hinted file itself, because the main process's blocks of it are on
the shelf (blocks/shelf.py), tells the main process of the open and of the close
with *notices*: one-way messages, batched, with no answer, so the coordinator there moves its
window on and frees the file's room without the open waiting for it.

A request that cannot be forwarded (the opener is gone, or is being replaced) raises
`ForwardFailed`, and the caller reads the pinned version itself, so a READ never fails because
another process died.
"""

from __future__ import annotations

import array
import contextlib
import errno
import itertools
import logging
import mmap
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from blobmount.fs.errno_map import FsError, errno_for

log = logging.getLogger(__name__)

#: what a server sends first on a connection: its pid (see ReadForwarder's `wake`)
_HELLO = struct.Struct("<I")
#: struct ucred: pid, uid, gid
_PEER_CREDENTIALS = struct.Struct("<iII")
#: socket buffers big enough for a whole 1 MiB answer: fewer wake-ups of both ends per answer
#: (the kernel caps them at net.core.wmem_max and rmem_max)
SOCKET_BUFFER = 4 * 1024 * 1024
#: request id, kind, then for a READ: handle, offset, size; for an OPEN: inode, flags, 0; for
#: a notice: 0, 0, the length of its text, which follows; last, the answer area's slot for the
#: READ's bytes (NO_SLOT: in the answer)
_REQUEST = struct.Struct("<QBQQIi")
NO_SLOT = -1
_READ, _OPEN = 0, 1
#: notices (no answer): a hinted file opened in the sending process; closed there, with its
#: shelved blocks unread, or read
NOTE_OPENED, NOTE_CLOSED, NOTE_USED = 2, 3, 4
_NOTICES = (NOTE_OPENED, NOTE_CLOSED, NOTE_USED)
#: a notice's text is a blob name and an ETag
MAX_NOTICE = 64 * 1024
#: what a server reads from a connection at once
_RECEIVE_CHUNK = 256 * 1024
#: an OPEN's answer: handle, keep_cache, direct_io
_OPENED = struct.Struct("<QBB")
#: request id, errno (0: the bytes follow), length of the bytes, whether they are in the
#: request's slot of the answer area (1) or follow the answer (0)
_ANSWER = struct.Struct("<QiIB")
#: what the forwarding process sends after the hello: the answer area's slots and slot size
#: (0 slots: none; its fd comes with it, as SCM_RIGHTS)
_AREA = struct.Struct("<II")
#: a slot holds the largest READ the kernel sends (FUSE's max_pages, 256 pages)
SLOT_BYTES = 1024 * 1024
#: slots per connection: READs in flight to one opener beyond this get their bytes through the
#: socket. Pages of the area are only allocated once a slot is used, so a connection costs what
#: its busiest moment used, at most 8 MiB.
AREA_SLOTS = 8
#: the largest READ the kernel sends is 1 MiB (FUSE's max_pages); anything much larger is a
#: broken peer, not a read
MAX_ANSWER = 64 * 1024 * 1024

#: what a server calls to read: the filesystem's own read of a handle it opened
ReadFn = Callable[[int, int, int], Awaitable[bytes | memoryview]]
#: what a server calls to open for another process: inode, flags -> handle, keep_cache, direct_io
OpenFn = Callable[[int, int], Awaitable[tuple[int, bool, bool]]]
#: what a server calls with a notice: its kind and text
NoticeFn = Callable[[int, bytes], None]


class ForwardFailed(Exception):
    """The READ could not be passed to its opener (no such process now, or it went away)."""


#: the main process's index: it serves the hints socket and holds the hinted blocks
MAIN_PROCESS = 0


class AnswerArea:
    """Shared memory that an opener writes READ answers into for the forwarding process (see
    the module's docstring): `slots` slots of `slot_bytes`, the lowest free one taken first so
    that a quiet connection keeps touching the same pages."""

    def __init__(self, slots: int = AREA_SLOTS, slot_bytes: int = SLOT_BYTES) -> None:
        self.slots, self.slot_bytes = slots, slot_bytes
        self.fd = os.memfd_create("blobmount-answers", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, slots * slot_bytes)
            self.map = mmap.mmap(self.fd, slots * slot_bytes)
        except BaseException:
            os.close(self.fd)
            raise
        self._free = list(range(slots - 1, -1, -1))

    def take(self, size: int) -> int:
        """A free slot for an answer of up to `size` bytes, or NO_SLOT."""
        if size > self.slot_bytes or not self._free:
            return NO_SLOT
        return self._free.pop()

    def give_back(self, slot: int) -> None:
        self._free.append(slot)
        self._free.sort(reverse=True)

    def view(self, slot: int, length: int) -> memoryview:
        start = slot * self.slot_bytes
        return memoryview(self.map)[start : start + length]

    def close_fd(self) -> None:
        """The fd has been passed on (or could not be): the mapping is all this side needs."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _unmap(area: mmap.mmap) -> None:
    # a view of it handed to the kernel's reply is gone once the reply is sent; one still
    # alive (a bug) keeps the mapping until it is collected
    with contextlib.suppress(BufferError):
        area.close()


def socket_path(folder: Path, index: int) -> Path:
    return folder / f"read-{index}.sock"


def _tune(sock: trio.socket.SocketType) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)


async def _send_all(sock: trio.socket.SocketType, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        sent = await sock.send(view)
        view = view[sent:]


async def _receive_exactly(sock: trio.socket.SocketType, length: int) -> bytearray:
    """`length` bytes; EOFError if the peer closed first."""
    out = bytearray(length)
    view = memoryview(out)
    got = 0
    while got < length:
        n = await sock.recv_into(view[got:])
        if n == 0:
            raise EOFError("the peer closed the connection")
        got += n
    return out


# -- the opener's side -----------------------------------------------------------------------


class ReadServer:
    """Answers forwarded READs of the handles this process opened, with `read`."""

    def __init__(
        self,
        folder: Path,
        index: int,
        read: ReadFn,
        wake: Callable[[int], None] | None = None,
        open_for: OpenFn | None = None,
        notice: NoticeFn | None = None,
    ) -> None:
        self.path = socket_path(folder, index)
        self._read = read
        self._open = open_for
        self._notice = notice
        #: called with the forwarding process's pid after each answer (see ReadForwarder)
        self._wake = wake
        self.served = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with listener:
            # a replaced worker's socket file is left behind: its successor takes the name
            self.path.unlink(missing_ok=True)
            await listener.bind(str(self.path))
            listener.listen(64)
            task_status.started()
            async with trio.open_nursery() as nursery:
                while True:
                    conn, _ = await listener.accept()
                    nursery.start_soon(self._serve, conn)

    async def _serve(self, conn: trio.socket.SocketType) -> None:
        sending = trio.Lock()
        with conn:
            try:
                _tune(conn)
                await _send_all(conn, _HELLO.pack(os.getpid()))
                peer_pid = _PEER_CREDENTIALS.unpack(
                    conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER_CREDENTIALS.size)
                )[0]
                area = await _receive_area(conn)
            except (OSError, EOFError, ValueError) as exc:
                log.debug("a forwarding connection failed at its start: %s", exc)
                return
            try:
                await self._serve_requests(conn, sending, peer_pid, area)
            finally:
                if area is not None:
                    _unmap(area[0])

    async def _serve_requests(
        self,
        conn: trio.socket.SocketType,
        sending: trio.Lock,
        peer_pid: int,
        area: tuple[mmap.mmap, int] | None,
    ) -> None:
        async with trio.open_nursery() as nursery:
            pending = bytearray()
            while True:
                try:
                    got = await conn.recv(_RECEIVE_CHUNK)
                except OSError:
                    return
                if not got:  # the forwarding process ended
                    return
                pending += got
                # every whole message received so far, in one step: notices come in batches,
                # and one scheduler round each would let them fall behind
                used = 0
                while len(pending) - used >= _REQUEST.size:
                    request = _REQUEST.unpack_from(pending, used)
                    kind, length = request[1], request[4]
                    if kind not in _NOTICES:
                        used += _REQUEST.size
                        nursery.start_soon(self._answer, conn, sending, peer_pid, request, area)
                        continue
                    if length > MAX_NOTICE:
                        log.warning("a notice of %d bytes: connection dropped", length)
                        return
                    end = used + _REQUEST.size + length
                    if len(pending) < end:
                        break
                    self._take_notice(kind, bytes(pending[used + _REQUEST.size : end]))
                    used = end
                del pending[:used]

    def _take_notice(self, kind: int, text: bytes) -> None:
        if self._notice is not None:
            try:
                self._notice(kind, text)
            except Exception:  # a notice must never stop the connection's READs
                log.exception("a notice from another process failed")

    async def _answer(
        self,
        conn: trio.socket.SocketType,
        sending: trio.Lock,
        peer_pid: int,
        request: tuple[int, int, int, int, int, int],
        area: tuple[mmap.mmap, int] | None,
    ) -> None:
        request_id, kind, number, offset, size, slot = request
        data: bytes | memoryview = b""
        error = 0
        try:
            if kind == _READ:
                data = await self._read(number, offset, size)
            elif kind == _OPEN and self._open is not None:
                fh, keep_cache, direct_io = await self._open(number, offset)
                data = _OPENED.pack(fh, keep_cache, direct_io)
            else:
                raise FsError(errno.ENOSYS, f"a forwarded request of kind {kind}")
        except Exception as exc:  # the errno FUSE would have answered, logged as it would be
            error, level = errno_for(exc)
            what = "open" if kind == _OPEN else "read"
            log.log(level, "%s failed: %s", what, exc, exc_info=level >= logging.ERROR)
        self.served += 1
        in_area = _write_slot(area, slot, data) if kind == _READ and data else False
        try:
            async with sending:
                await _send_all(conn, _ANSWER.pack(request_id, error, len(data), in_area))
                if data and not in_area:
                    await _send_all(conn, data)
        except OSError as exc:  # the forwarding process ended while it waited
            log.debug("a forwarded read's answer was not delivered: %s", exc)
            return
        if self._wake is not None:
            self._wake(peer_pid)


async def _receive_area(conn: trio.socket.SocketType) -> tuple[mmap.mmap, int] | None:
    """(opener) The forwarding process's answer area, sent after the hello: (its mapping, the
    slot size), or None if it has none. Raises EOFError or ValueError on a broken peer."""
    fds = array.array("i")
    message, ancillary, _, _ = await conn.recvmsg(_AREA.size, socket.CMSG_SPACE(fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    try:
        if not message:
            raise EOFError("the peer closed the connection")
        if len(message) < _AREA.size:  # the rest of a message split in two (never seen)
            message += await _receive_exactly(conn, _AREA.size - len(message))
        slots, slot_bytes = _AREA.unpack(message)
        if not slots:
            return None
        if len(fds) != 1 or slot_bytes > MAX_ANSWER:
            raise ValueError(f"an answer area of {slots} x {slot_bytes} bytes, {len(fds)} fds")
        return mmap.mmap(fds[0], slots * slot_bytes), slot_bytes
    finally:
        for fd in fds:
            os.close(fd)


def _write_slot(area: tuple[mmap.mmap, int] | None, slot: int, data: bytes | memoryview) -> bool:
    """(opener) Copy a READ's answer into its slot of the answer area, if it has one and the
    bytes fit; whether it did."""
    if area is None or slot < 0:
        return False
    mapping, slot_bytes = area
    length = len(data)
    start = slot * slot_bytes
    if length > slot_bytes or start + slot_bytes > len(mapping):
        return False
    mapping[start : start + length] = data
    return True


# -- the side that got the READ --------------------------------------------------------------


class _Pending:
    __slots__ = ("data", "done", "errno", "in_area", "length", "problem")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.data: bytearray | None = None
        self.errno = 0  # the opener's answer: 0, or the read's errno
        self.in_area = False  # the bytes are in the request's slot, `length` of them
        self.length = 0
        self.problem: ForwardFailed | None = None  # no answer came


class _Connection:
    """One connection to another process's server, with its answers in flight and the answer
    area its READs' bytes are written into (None: they come through the socket)."""

    def __init__(self, sock: trio.socket.SocketType, pid: int, area: AnswerArea | None) -> None:
        self.sock = sock
        self.pid = pid  # the server's
        self.area = area
        self.sending = trio.Lock()
        self.pending: dict[int, _Pending] = {}
        #: slots of interrupted READs, by request id: the opener may still write them, so each
        #: is free only once its answer has come
        self.orphans: dict[int, int] = {}
        self.closed = False

    async def receive_answers(self) -> None:
        try:
            while True:
                raw = await _receive_exactly(self.sock, _ANSWER.size)
                request_id, error, length, in_area = _ANSWER.unpack(raw)
                if length > MAX_ANSWER:
                    raise OSError(errno.EPROTO, f"an answer of {length} bytes")
                data = bytearray()
                if length and not in_area:
                    data = await _receive_exactly(self.sock, length)
                waiter = self.pending.pop(request_id, None)
                if waiter is not None:
                    waiter.data, waiter.errno = data, error
                    waiter.in_area, waiter.length = bool(in_area), length
                    waiter.done.set()
                else:  # its READ was interrupted: the bytes are dropped, its slot is free
                    slot = self.orphans.pop(request_id, NO_SLOT)
                    if slot != NO_SLOT and self.area is not None:
                        self.area.give_back(slot)
        except (OSError, EOFError, trio.ClosedResourceError) as exc:  # closed: by `close`
            self.fail(ForwardFailed(f"the opening process went away: {exc}"))
        finally:
            self.fail(ForwardFailed("the connection closed"))

    def fail(self, problem: ForwardFailed) -> None:
        """Close the connection; every read waiting on it fails with `problem`. (Its answer
        area is not unmapped here: a READ woken by an answer just before may still be on its
        way to make a view of its slot; the mapping goes when nothing refers to it.)"""
        if not self.closed:
            self.closed = True
            self.sock.close()
        for waiter in self.pending.values():
            waiter.problem = problem
            waiter.done.set()
        self.pending.clear()


class ReadForwarder:
    """Passes READs to the process that opened their handle (see the module's docstring)."""

    def __init__(
        self,
        folder: Path,
        index: int,
        nursery: trio.Nursery,
        wake: Callable[[int], None] | None = None,
        *,
        area_slots: int = AREA_SLOTS,
        slot_bytes: int = SLOT_BYTES,
    ) -> None:
        self._folder = folder
        self.index = index
        #: each connection's answer area (0 slots: none, every answer through the socket)
        self._area_shape = (area_slots, slot_bytes)
        self._nursery = nursery
        #: called with the opener's pid after each request: the opener may be blocked reading
        #: /dev/fuse (having lost a request to another process), where no socket wakes it
        self._wake = wake
        self._connections: dict[int, _Connection] = {}
        self._ids = itertools.count(1)
        #: notices waiting to be sent, per process; a process's are sent by one task at a time
        self._outbox: dict[int, list[bytes]] = {}
        self.forwarded = 0
        #: forwarded READs whose bytes came in the answer area
        self.in_area = 0
        self.opens = 0
        self.failed = 0
        self.notices = 0
        self.notices_lost = 0

    async def read(self, owner: int, fh: int, offset: int, size: int) -> bytes | memoryview:
        """The bytes the opener `owner` reads for handle `fh`. Raises FsError with the
        opener's errno, or ForwardFailed (read it yourself)."""
        try:
            data = await self._ask(owner, _READ, fh, offset, size)
        except FsError:
            self.forwarded += 1  # answered, with an error
            raise
        self.forwarded += 1
        if isinstance(data, memoryview):
            self.in_area += 1
            return data
        return memoryview(data)

    async def open(self, owner: int, inode: int, flags: int) -> tuple[int, bool, bool]:
        """Have process `owner` open `inode`: its handle, keep_cache and direct_io. Raises
        FsError with its errno, or ForwardFailed (open it yourself)."""
        try:
            data = await self._ask(owner, _OPEN, inode, flags, 0)
        except FsError:
            self.opens += 1
            raise
        try:
            fh, keep_cache, direct_io = _OPENED.unpack(data)
        except struct.error as exc:
            self.failed += 1
            raise ForwardFailed(f"an open answered with {len(data)} bytes") from exc
        self.opens += 1
        return fh, bool(keep_cache), bool(direct_io)

    def post(self, owner: int, kind: int, text: bytes) -> None:
        """Send process `owner` a notice, soon (batched with the others of this moment); no
        answer comes. A notice that cannot be delivered is counted in `notices_lost`."""
        message = _REQUEST.pack(0, kind, 0, 0, len(text), NO_SLOT) + text
        box = self._outbox.get(owner)
        if box is not None:  # a task is sending this process's notices: it takes this one too
            box.append(message)
            return
        self._outbox[owner] = [message]
        self._nursery.start_soon(self._send_notices, owner)

    async def _send_notices(self, owner: int) -> None:
        try:
            while box := self._outbox.get(owner):
                self._outbox[owner] = []
                try:
                    conn = await self._connection(owner)
                    try:
                        async with conn.sending:
                            await _send_all(conn.sock, b"".join(box))
                    except OSError as exc:  # the next request connects afresh
                        conn.fail(ForwardFailed(f"the process went away: {exc}"))
                        raise ForwardFailed(f"the process went away: {exc}") from exc
                    self.notices += len(box)
                except ForwardFailed as exc:
                    self.notices_lost += len(box)
                    log.debug("%d notices to process %d lost: %s", len(box), owner, exc)
        finally:
            self._outbox.pop(owner, None)

    async def _ask(
        self, owner: int, kind: int, number: int, offset: int, size: int
    ) -> bytearray | memoryview:
        """Send one request to process `owner` and wait for its answer's bytes: a view of
        the answer area (valid until this task next waits: the caller hands it straight to
        the kernel), or the bytes that came through the socket."""
        try:
            conn = await self._connection(owner)
            area = conn.area if kind == _READ else None
            slot = NO_SLOT if area is None else area.take(size)
            request_id = next(self._ids)
            waiter = conn.pending[request_id] = _Pending()
            sent = False
            try:
                try:
                    async with conn.sending:
                        request = _REQUEST.pack(request_id, kind, number, offset, size, slot)
                        await _send_all(conn.sock, request)
                        sent = True
                except OSError as exc:  # the next read connects afresh
                    conn.fail(ForwardFailed(f"the opening process went away: {exc}"))
                    raise ForwardFailed(f"the opening process went away: {exc}") from exc
                if self._wake is not None:
                    self._wake(conn.pid)
                await waiter.done.wait()
            finally:
                conn.pending.pop(request_id, None)
                if slot != NO_SLOT:
                    assert area is not None
                    if sent and not waiter.done.is_set() and not conn.closed:
                        conn.orphans[request_id] = slot  # its answer may still be written
                    else:
                        # answered (no checkpoint from here until the kernel has the view's
                        # bytes), never sent, or the connection (and its area) is gone
                        area.give_back(slot)
        except ForwardFailed:
            self.failed += 1
            raise
        if waiter.problem is not None:
            self.failed += 1
            raise waiter.problem
        if waiter.errno:
            raise FsError(waiter.errno)
        if waiter.in_area:
            if area is None or slot == NO_SLOT:  # a broken peer
                self.failed += 1
                raise ForwardFailed("an answer in a slot that was not asked for")
            return area.view(slot, waiter.length)
        assert waiter.data is not None
        return waiter.data

    async def _connection(self, owner: int) -> _Connection:
        conn = self._connections.get(owner)
        if conn is not None and not conn.closed:
            return conn
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _tune(sock)
            await sock.connect(str(socket_path(self._folder, owner)))
            (pid,) = _HELLO.unpack(await _receive_exactly(sock, _HELLO.size))
            area = await _send_area(sock, *self._area_shape)
        except (OSError, EOFError) as exc:
            sock.close()
            raise ForwardFailed(f"no process {owner} to pass the read to: {exc}") from exc
        other = self._connections.get(owner)
        if other is not None and not other.closed:  # a concurrent read connected first
            sock.close()
            return other
        conn = self._connections[owner] = _Connection(sock, pid, area)
        self._nursery.start_soon(conn.receive_answers)
        return conn

    def close(self) -> None:
        for conn in self._connections.values():
            conn.fail(ForwardFailed("closing"))
        self._connections.clear()


async def _send_area(
    sock: trio.socket.SocketType, slots: int, slot_bytes: int
) -> AnswerArea | None:
    """(forwarding side) Make a connection's answer area and pass it to the opener; None (and
    the bytes come through the socket) for no slots or where shared memory cannot be had."""
    area: AnswerArea | None = None
    if slots > 0:
        try:
            area = AnswerArea(slots, slot_bytes)
        except OSError as exc:
            log.info(
                "no answer area for forwarded reads (%s): their bytes go through the socket", exc
            )
    if area is None:
        await _send_all(sock, _AREA.pack(0, 0))
        return None
    try:
        message = _AREA.pack(area.slots, area.slot_bytes)
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [area.fd]))]
        if await sock.sendmsg([message], rights) != len(message):
            raise OSError(errno.EPROTO, "the answer area's message was cut short")
    finally:
        area.close_fd()
    return area
