"""Claims: one process of a multi-process mount does a piece of work, the others wait for it.

Two processes of a mount often need the same thing at the same moment: a list page when they
walk the same folder (`storage.shared_pages`), a whole file when a job's opens of it land in
both, or a hinted file the main process fetches while the job opens it elsewhere
(`multiproc.whole_file_copies`). A claim is a file created exclusively in the mount's shared folder
(memory: /dev/shm), holding the claimer's pid: whoever creates it does the work and removes it
when the result is where the others look; the others wait for that.

A claim is no promise: a waiter that finds the claim gone without a result (the work failed)
or its process dead does the work itself, so a claim never costs more than the work done twice.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import TypeVar

import trio

from blobmount.runstate import pid_alive

log = logging.getLogger(__name__)

T = TypeVar("T")

#: a claim still without its pid after this long was left by a process that died
UNWRITTEN_CLAIM_S = 5.0
#: the first and the longest pause between two looks for a claimed result
FIRST_LOOK_S = 0.0005
LAST_LOOK_S = 0.02


class Claim(Enum):
    OURS = "ours"  # this process does the work; the others wait for it
    THEIRS = "theirs"  # a live process does it: wait for its result
    NONE = "none"  # no claim can be made (an unwritable folder): work unshared


def make_claim(claim: Path) -> Claim:
    """Claim the work `claim` stands for, unless a live process has claimed it."""
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            if claimer_alive(claim):
                return Claim.THEIRS
            release(claim)  # its process is gone: claim it afresh
            continue
        except OSError:
            return Claim.NONE
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)
        return Claim.OURS
    return Claim.NONE


def release(claim: Path) -> None:
    """Give a claim up (the result is in place, or the work failed)."""
    try:
        os.unlink(claim)
    except FileNotFoundError:
        pass


async def claimed_result(
    claim: Path, look: Callable[[], T | None], wait_s: float, what: str
) -> T | None:
    """What `look` finds once the claimer of `claim` is done; None if it ended without a result,
    its process is gone, or it took longer than `wait_s` (logged, with `what` the work)."""
    deadline = trio.current_time() + wait_s
    pause = FIRST_LOOK_S
    while trio.current_time() < deadline:
        await trio.sleep(pause)
        found = look()
        if found is not None:
            return found
        if not _exists(claim):
            return look()  # put in place just before the claim went
        if pause >= LAST_LOOK_S and not claimer_alive(claim):
            return None
        pause = min(pause * 2, LAST_LOOK_S)
    log.warning("%s, claimed by another process, took over %.0fs: doing it here", what, wait_s)
    return None


def _exists(path: Path) -> bool:
    return path.exists()  # a stat in /dev/shm: memory, no disk to wait for


def claimer_alive(claim: Path) -> bool:
    """Whether the process whose pid `claim` holds is alive (a claim being written counts)."""
    try:
        text = claim.read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    if not text.isdigit():
        # created, its pid not written yet; or its process died in between
        try:
            return time.time() - claim.stat().st_mtime < UNWRITTEN_CLAIM_S
        except FileNotFoundError:
            return False
    return pid_alive(int(text))
