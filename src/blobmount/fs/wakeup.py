"""A per-process timer that frees a blocked read of /dev/fuse (developer-notes/multicore.md).

When several processes serve one FUSE connection, trio wakes all of them when a request
arrives, but only one gets it. pyfuse3 follows `wait_readable(session_fd)` with a blocking
`read()` made while holding the GIL, so a process that lost the race sleeps in the kernel until
the next request comes: its trio loop, its finished fetches' replies and its other threads all
wait with it, on a quiet mount for ever.

A process can only be stuck in that window: between `wait_readable` returning and the next
request handler starting. So `wait_readable` (reached through a facade that replaces
`pyfuse3.trio`) arms a timer just before it returns, and every handler calls `disarm()` as it
starts. A read that blocks for one period is hit by the timer's signal; the handler has no
SA_RESTART, so the read returns EINTR, pyfuse3 retries by going back to `wait_readable`, and
the process is in trio's loop again. A read that did not block costs two syscalls.

The timer repeats while armed: a single shot can fire before the read begins (the process was
preempted, or collecting garbage, between arming and reading) and interrupt nothing, leaving the
read to block. The Python handler stops it after `repeat_for_s`, so a request that pyfuse3
answers without calling a Python handler cannot leave it firing.

Linux x86_64 only (the `struct sigevent` layout and `SIGEV_THREAD_ID`).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import signal
import threading
from types import FrameType
from typing import Any

import trio

SIGNAL: int = signal.SIGRTMIN + 2
_CLOCK_MONOTONIC = 1
_SIGEV_THREAD_ID = 4
_SYS_TGKILL = 234  # x86_64


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _ITimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _Sigevent(ctypes.Structure):
    # x86_64: sigev_value (8 bytes), sigev_signo, sigev_notify, then a union whose first int is
    # the thread id SIGEV_THREAD_ID sends the signal to; 64 bytes in all
    _fields_ = [
        ("sigev_value", ctypes.c_void_p),
        ("sigev_signo", ctypes.c_int),
        ("sigev_notify", ctypes.c_int),
        ("sigev_tid", ctypes.c_int),
        ("_pad", ctypes.c_int * 11),
    ]


assert ctypes.sizeof(_Sigevent) == 64


def _spec(value_s: float, interval_s: float) -> _ITimerspec:
    def ts(seconds: float) -> _Timespec:
        whole = int(seconds)
        return _Timespec(whole, round((seconds - whole) * 1e9))

    return _ITimerspec(ts(interval_s), ts(value_s))


class _State:
    """This process's timer. Arming and disarming run in the main thread only, as does the
    signal handler, so plain attributes are enough."""

    __slots__ = ("arm_spec", "armed", "limit", "off_spec", "pid", "settime", "since_arm", "timer")

    def __init__(self, timer: ctypes.c_void_p, settime: Any, period_s: float, limit: int) -> None:
        self.pid = os.getpid()
        self.timer = timer
        self.settime = settime
        self.arm_spec = _spec(period_s, period_s)  # repeating: see the module docstring
        self.off_spec = _spec(0, 0)
        self.limit = limit
        self.armed = False
        self.since_arm = 0


_state: _State | None = None
_wakeups = 0


def _arm() -> None:
    """Start the timer (restarting its count): a read that blocks from now on is interrupted."""
    s = _state
    if s is not None:
        s.since_arm = 0
        s.armed = True
        s.settime(s.timer, 0, s.arm_spec, None)


def disarm() -> None:
    """Stop the timer; called as every request handler starts. No syscall when not armed."""
    s = _state
    if s is not None and s.armed:
        s.armed = False
        s.settime(s.timer, 0, s.off_spec, None)


def armed() -> bool:
    """Whether this process's timer is running (for tests)."""
    return _state is not None and _state.armed


def wakeups() -> int:
    """How many times this process's signal handler has run.

    Each is a timer signal that came a whole period after `wait_readable` returned with no
    request handler started since: mostly a read of /dev/fuse that blocked because another
    process took the request, which the signal has freed. Several after one arming mean the
    process was held up before it reached the read (preempted, collecting garbage), or a request
    was answered without a Python handler. Signals that arrive while the handler cannot run are
    merged into one.
    """
    return _wakeups


def is_enabled() -> bool:
    """Whether `enable_blocked_read_wakeup` has run in this process (not in a parent)."""
    return _state is not None and _state.pid == os.getpid()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _wakeups
    _wakeups += 1
    s = _state
    if s is not None:
        s.since_arm += 1
        if s.since_arm >= s.limit:
            disarm()  # nobody disarmed it for repeat_for_s: stop signalling an idle process


def wake(pid: int) -> None:
    """Send the signal to the main thread of mount process `pid` (which has enabled this): a
    read of /dev/fuse it is blocked in returns to trio now, not at its timer's next period. For
    work another process hands it outside FUSE (a forwarded READ), which would not end its
    blocked read as a FUSE request would."""
    # tgkill, not kill: only the main thread is blocked in pyfuse3's read; a process-directed
    # signal may go to any of its threads. A gone process is no error here.
    _libc().syscall(_SYS_TGKILL, pid, pid, SIGNAL)


def _forget_after_fork() -> None:
    # timers are not inherited: the child's timer id would name nothing, or another timer
    global _state, _wakeups
    _state = None
    _wakeups = 0


os.register_at_fork(after_in_child=_forget_after_fork)


def _stop_at_exit() -> None:
    # Python gives its handled signals their default action back as it finalizes, and that of
    # a real-time signal ends the process: an armed timer would turn an exit into a death by
    # signal (and lose the exit status a worker reports to its zygote)
    if is_enabled():
        disarm()
        signal.signal(SIGNAL, signal.SIG_IGN)


atexit.register(_stop_at_exit)


def _create_timer() -> tuple[ctypes.c_void_p, Any]:
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "timer_create"):  # glibc before 2.34 keeps it in librt
        libc = ctypes.CDLL("librt.so.1", use_errno=True)
    create = libc.timer_create
    create.argtypes = [ctypes.c_int, ctypes.POINTER(_Sigevent), ctypes.POINTER(ctypes.c_void_p)]
    create.restype = ctypes.c_int
    settime = libc.timer_settime
    settime.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.POINTER(_ITimerspec),
        ctypes.POINTER(_ITimerspec),
    ]
    settime.restype = ctypes.c_int

    event = _Sigevent()
    event.sigev_signo = SIGNAL
    event.sigev_notify = _SIGEV_THREAD_ID
    # only the main thread: it is the one blocked in pyfuse3's read
    event.sigev_tid = threading.get_native_id()
    timer = ctypes.c_void_p()
    if create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) != 0:
        err = ctypes.get_errno()
        raise RuntimeError(f"timer_create failed: {os.strerror(err)} (errno {err})")
    return timer, settime


class _LowlevelFacade:
    """`trio.lowlevel` for pyfuse3, except that `wait_readable` arms the timer as it returns."""

    def __getattr__(self, name: str) -> Any:
        return getattr(trio.lowlevel, name)

    @staticmethod
    async def wait_readable(fd: int) -> None:
        # back in trio's wait: a signal now would only wake the loop for nothing
        disarm()
        await trio.lowlevel.wait_readable(fd)
        # nothing awaits between here and pyfuse3's read, which may block
        _arm()


class _TrioFacade:
    """`trio` for pyfuse3 (its module global, looked up at each use), with `_LowlevelFacade`."""

    lowlevel = _LowlevelFacade()

    def __getattr__(self, name: str) -> Any:
        return getattr(trio, name)


def enable_blocked_read_wakeup(period_s: float = 0.005, repeat_for_s: float = 1.0) -> None:
    """Make this process's blocked reads of /dev/fuse return to trio after about `period_s`.

    Call it in the main thread of each process that serves the mount (after a fork too: the
    timer is per process). A second call in the same process does nothing.
    """
    global _state
    if is_enabled():
        return
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("enable_blocked_read_wakeup must be called in the main thread")
    if not 0 < period_s <= repeat_for_s:
        raise ValueError(f"need 0 < period_s <= repeat_for_s, got {period_s}, {repeat_for_s}")
    import pyfuse3  # lazy: the fuse extra; only a mounting process gets here

    # `trio` is a global of the extension module, which its stub does not declare
    fuse: Any = pyfuse3
    if not isinstance(fuse.trio, _TrioFacade) and fuse.trio is not trio:
        raise RuntimeError(f"pyfuse3.trio is already replaced (by {fuse.trio!r})")

    # the timer first: it does nothing until armed, and a failure leaves nothing changed
    timer, settime = _create_timer()
    # the handler before any arming: the signal's default action would end the process
    signal.signal(SIGNAL, _on_signal)
    signal.siginterrupt(SIGNAL, True)  # no SA_RESTART: the blocked read returns EINTR
    _state = _State(timer, settime, period_s, max(1, round(repeat_for_s / period_s)))
    if not isinstance(fuse.trio, _TrioFacade):
        fuse.trio = _TrioFacade()
