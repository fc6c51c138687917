"""Serving one FUSE connection from several processes: the process plumbing.

The kernel hands each request of a FUSE connection to whichever process reads the device first,
so several processes can serve one mount, each with its own event loop and GIL. libfuse refuses
every request of a session that has not seen the kernel's INIT, and INIT comes once per
connection, so extra processes must be forked after INIT has been answered, inheriting a session
that has seen it (docs/developer-notes/multicore.md has the measurements behind this):

1. `answer_init` runs pyfuse3's loop in a helper thread until Operations.init() has run (libfuse
   sends the INIT reply in that same call), then cancels the loop without ending the session.
   The thread matters: libfuse reads requests through a pipe of the reading thread, and a pipe
   made by the main thread would be shared by every process forked from it. Once the thread has
   ended, the process is single-threaded again, so forking is safe.
2. `Zygote.start` forks a small single-threaded process that forks the workers and forks a new
   one when a worker dies. The main process goes on to start threads (the asyncio bridge,
   trio's thread cache) and must not fork after that.
3. Each worker (`become_worker`) dies with the zygote (PR_SET_PDEATHSIG, which the zygote also
   sets towards the main process, so nothing outlives a SIGKILLed main process) and reads the
   connection through its own clone of the device fd (FUSE_DEV_IOC_CLONE): the requests a
   SIGKILLed worker had read are then ended by the kernel rather than left waiting for ever.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import signal
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyfuse3
import trio

log = logging.getLogger(__name__)

#: _IOR(229, 0, uint32_t): make a device fd read and answer the connection of another
FUSE_DEV_IOC_CLONE = (2 << 30) | (4 << 16) | (229 << 8)
PR_SET_PDEATHSIG = 1
#: a worker that exits with this status has seen its connection end: it is not replaced
EXIT_CONNECTION_ENDED = 0
#: a worker that dies sooner than this after starting is replaced after a growing delay
STABLE_AFTER_S = 10.0
RESTART_DELAYS_S = (0.1, 5.0)


def session_fd() -> int:
    """The /dev/fuse fd of this process's session (pyfuse3 does not expose it; a mounting
    process holds exactly one)."""
    found = [
        int(fd)
        for fd in os.listdir("/proc/self/fd")
        if os.path.realpath(f"/proc/self/fd/{fd}") == "/dev/fuse"
    ]
    if len(found) != 1:
        raise RuntimeError(f"expected one /dev/fuse descriptor, found {len(found)}")
    return found[0]


def answer_init(on_init: Callable[[Callable[[], None]], None], timeout_s: float = 30.0) -> None:
    """Serve the mount until the kernel's INIT has been answered, in a helper thread.

    `on_init(callback)` must arrange for `callback` to be called from Operations.init() (see
    `fs.fuse_ops.FuseOperations.on_init`). Raises TimeoutError if INIT does not come within
    `timeout_s`, and RuntimeError if a thread is still running afterwards."""
    problems: list[BaseException] = []

    async def until_init() -> None:
        seen = trio.Event()
        on_init(seen.set)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pyfuse3.main, 1)
            with trio.move_on_after(timeout_s):
                await seen.wait()
            # cancelled, not pyfuse3.terminate(): that would end the session for every process
            nursery.cancel_scope.cancel()
        if not seen.is_set():
            raise TimeoutError(f"the kernel sent no INIT within {timeout_s:.0f}s")

    def run() -> None:
        try:
            trio.run(until_init)
        except BaseException as exc:  # reported in the calling thread
            problems.append(exc)

    helper = threading.Thread(target=run, name="fuse-init")
    helper.start()
    helper.join()
    if problems:
        raise problems[0]
    if threading.active_count() != 1:
        names = [t.name for t in threading.enumerate()]
        raise RuntimeError(f"threads still running after INIT, cannot fork: {names}")


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent (pid `parent`, taken before the
    fork) dies, and die now if it died before the signal was set: the kernel sends it only for
    a death after the prctl, and an orphan would otherwise serve on with nobody to stop it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    if os.getppid() != parent:
        os._exit(1)


def clone_session_fd() -> None:
    """Read and answer the connection through a clone of the session's device fd, under the
    same fd number libfuse and pyfuse3 already use."""
    shared = session_fd()
    own = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(own, FUSE_DEV_IOC_CLONE, struct.pack("I", shared))
        os.dup2(own, shared, inheritable=False)
    finally:
        os.close(own)


@dataclass(frozen=True, slots=True)
class WorkerEvent:
    """What the zygote tells the main process: a worker started or ended."""

    kind: str  # "started" or "ended"
    index: int
    pid: int
    #: for "ended": the exit status, or minus the signal that killed it
    status: int = 0

    def encode(self) -> bytes:
        return f"{self.kind} {self.index} {self.pid} {self.status}\n".encode()

    @classmethod
    def decode(cls, line: bytes) -> WorkerEvent:
        kind, index, pid, status = line.split()
        return cls(kind.decode(), int(index), int(pid), int(status))


class Zygote:
    """A single-threaded process that forks the worker processes and replaces those that die.

    Workers are numbered 1..count (the main process serves as 0). `run_worker(index)` runs in
    each new worker after `become_worker` and returns its exit status. A worker that exits with
    EXIT_CONNECTION_ENDED is not replaced (the mount is gone); any other end is, after a delay
    that grows while workers keep dying young. The zygote reports each start and end on a pipe
    (`events_fd`, `read_events`)."""

    def __init__(self, count: int, run_worker: Callable[[int], int]) -> None:
        self.count = count
        self._run_worker = run_worker
        self.pid = 0
        self.events_fd = -1
        self._buffer = b""

    def start(self) -> None:
        """Fork the zygote (call while this process has no other thread)."""
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the zygote
            os.close(read_end)
            status = 1
            try:
                die_with_parent(parent)
                status = _ZygoteLoop(self.count, self._run_worker, write_end).run()
            except BaseException:
                log.exception("the worker zygote failed")
            os._exit(status)
        os.close(write_end)
        os.set_blocking(read_end, False)
        self.pid, self.events_fd = pid, read_end
        log.info("worker zygote %d starts %d worker processes", pid, self.count)

    def read_events(self) -> list[WorkerEvent]:
        """The events that have arrived since the last call (never blocks)."""
        try:
            while chunk := os.read(self.events_fd, 65536):
                self._buffer += chunk
        except BlockingIOError:
            pass
        *lines, self._buffer = self._buffer.split(b"\n")
        return [WorkerEvent.decode(line) for line in lines if line]

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """Stop replacing workers, end them (SIGTERM, then SIGKILL after `timeout_s`) and wait
        for the zygote. Returns its exit status (None if it had to be killed)."""
        if not self.pid:
            return None
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout_s + 1.0
        status: int | None = None
        while time.monotonic() < deadline:
            done, raw = os.waitpid(self.pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(raw)
                break
            time.sleep(0.02)
        else:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.events_fd)
        self.pid = 0
        return status


def become_worker(zygote: int) -> None:
    """What a new worker does before serving: default signal handling, die with the zygote
    (pid `zygote`), its own clone of the device fd."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    die_with_parent(zygote)
    clone_session_fd()


class _ZygoteLoop:
    """The zygote's life: fork, wait for signals, replace the dead, stop on SIGTERM."""

    def __init__(self, count: int, run_worker: Callable[[int], int], events_fd: int) -> None:
        self._count = count
        self._run_worker = run_worker
        self._events_fd = events_fd
        self._alive: dict[int, tuple[int, float]] = {}  # pid -> (index, started)
        self._due: dict[int, float] = {}  # index -> when to fork it again
        self._delay = dict.fromkeys(range(1, count + 1), RESTART_DELAYS_S[0])
        self._stopping = False

    def run(self) -> int:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGCHLD, signal.SIGINT})
        for index in range(1, self._count + 1):
            self._fork(index)
        while self._alive or (self._due and not self._stopping):
            self._fork_due()
            wait_s = max(0.0, min(self._due.values()) - time.monotonic()) if self._due else None
            info = signal.sigtimedwait(
                {signal.SIGTERM, signal.SIGCHLD, signal.SIGINT},
                wait_s if wait_s is not None else 3600.0,
            )
            if info is not None and info.si_signo in (signal.SIGTERM, signal.SIGINT):
                self._stop()
            self._reap()
        return 0

    def _fork(self, index: int) -> None:
        zygote = os.getpid()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                os.close(self._events_fd)
                become_worker(zygote)
                status = self._run_worker(index)
            except BaseException:
                log.exception("worker %d failed", index)
            os._exit(status)
        self._alive[pid] = (index, time.monotonic())
        self._tell(WorkerEvent("started", index, pid))

    def _fork_due(self) -> None:
        now = time.monotonic()
        for index, when in list(self._due.items()):
            if when <= now and not self._stopping:
                del self._due[index]
                self._fork(index)

    def _reap(self) -> None:
        while self._alive:
            try:
                pid, raw = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            index, started = self._alive.pop(pid)
            status = os.waitstatus_to_exitcode(raw)
            self._tell(WorkerEvent("ended", index, pid, status))
            if self._stopping or status == EXIT_CONNECTION_ENDED:
                continue
            young = time.monotonic() - started < STABLE_AFTER_S
            delay = self._delay[index] if young else RESTART_DELAYS_S[0]
            self._due[index] = time.monotonic() + delay
            self._delay[index] = min(RESTART_DELAYS_S[1], delay * 2)

    def _stop(self) -> None:
        self._stopping = True
        self._due.clear()
        for pid in self._alive:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _tell(self, event: WorkerEvent) -> None:
        try:
            os.write(self._events_fd, event.encode())
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
