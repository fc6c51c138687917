"""Children forked by a test: each leaves through os._exit (its status says whether its own
checks passed), and every wait has a deadline, so a failure cannot hang the test run."""

from __future__ import annotations

import os
import select
import signal
import time
import traceback
from collections.abc import Callable

import pytest

WAIT_S = 60.0


def fork(child: Callable[[], object]) -> int:
    """Run `child` in a forked process; it exits 0 if `child` returned, 1 if it raised."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            child()
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    return pid


def wait(pid: int, timeout: float = WAIT_S) -> int:
    """Child `pid`'s exit status (negative: the signal that ended it); killed, and the test
    failed, if it has not ended within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"child {pid} did not end within {timeout} s")
        time.sleep(0.002)


def read_line(fd: int, timeout: float = WAIT_S) -> bytes:
    """One line from pipe `fd` (a child's word), within `timeout`."""
    deadline, data = time.monotonic() + timeout, b""
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            pytest.fail("no word from a child in time")
        chunk = os.read(fd, 1)
        if not chunk:
            pytest.fail("a child ended without a word")
        data += chunk
    return data
