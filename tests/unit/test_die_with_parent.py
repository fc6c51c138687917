"""A forked process of a multi-process mount dies with its parent, even when the parent died
between the fork and the child's prctl (the kernel sends PDEATHSIG only for a later death)."""

from __future__ import annotations

import ctypes
import os
import time

from blobmount.fuse_processes import die_with_parent
from tests.helpers.forked import fork, read_line, wait

PR_SET_CHILD_SUBREAPER = 36
#: the grandchild's status when die_with_parent let it go on
WENT_ON = 7


def _grandchild_status(parent_gone_first: bool) -> int:
    """In a subreaper child (so the orphan comes back to be waited for): fork a parent that
    forks a child and exits, the child calling die_with_parent(parent) before or after that
    exit. Returns the child's exit status (negative: the signal that ended it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    set_read, set_write = os.pipe()  # the child to its parent: the signal is set
    pid_read, pid_write = os.pipe()  # the parent to this process: the child's pid
    parent = os.fork()
    if parent == 0:
        parent_pid = os.getpid()
        child = os.fork()
        if child == 0:
            if parent_gone_first:
                while os.getppid() == parent_pid:
                    time.sleep(0.001)
            die_with_parent(parent_pid)
            os.write(set_write, b"s")
            time.sleep(5)  # long enough to be killed when the parent goes
            os._exit(WENT_ON)
        os.write(pid_write, f"{child}\n".encode())
        if not parent_gone_first:
            os.read(set_read, 1)
        os._exit(0)
    child = int(read_line(pid_read))
    assert wait(parent) == 0
    return wait(child, timeout=10)


def _expect(parent_gone_first: bool, status: int) -> None:
    got = _grandchild_status(parent_gone_first)
    if got != status:
        raise AssertionError(f"the child ended with {got}, not {status}")


def test_a_child_whose_parent_dies_later_is_killed() -> None:
    assert wait(fork(lambda: _expect(False, -9))) == 0


def test_a_child_whose_parent_died_before_the_prctl_exits_at_once() -> None:
    assert wait(fork(lambda: _expect(True, 1))) == 0
