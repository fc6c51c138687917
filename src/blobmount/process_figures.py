"""One process of a mount as the stats show it: the FUSE requests it took from the kernel, the
CPU it spent, and the time it held the locks every process takes in turn.

With several processes (DATASET_MOUNT_WORKER_PROCESSES) the stats list one entry per live
process, so an operator sees how the kernel spreads the requests, and the benchmark measures
the serial part of the mount (docs/developer-notes/multicore.md): the main process's CPU beyond
what its share of the requests costs a worker, plus the time spent holding the shared locks.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from blobmount.multiproc import lock_time


@dataclass(frozen=True, slots=True)
class ProcessFigures:
    """One process's figures since it started."""

    pid: int
    #: the process that serves the stats, hints and metrics (the only one of a 1-process mount)
    main: bool
    #: FUSE requests this process read from the kernel and answered (or passed on)
    requests: int
    #: of those, the ones another process did the work of: READs of a handle the other opened,
    #: OPENs of a file the main process has hints for (fs/forward.py)
    passed_on: int
    #: requests another process read from the kernel and passed here to do
    answered_for_others: int
    #: bytes this process's handles served, to the kernel or to the process that passed a
    #: READ on
    bytes_served: int
    #: CPU seconds, user and system, of every thread of the process
    cpu_s: float
    #: seconds it held the mount-wide locks of the shared tables (`multiproc.lock_time`)
    shared_lock_s: float


def this_process(
    main: bool,
    requests: int,
    passed_on: int = 0,
    answered_for_others: int = 0,
    bytes_served: int = 0,
) -> ProcessFigures:
    """The calling process's figures now."""
    return ProcessFigures(
        os.getpid(),
        main,
        requests,
        passed_on,
        answered_for_others,
        bytes_served,
        time.process_time(),
        lock_time.held_s(),
    )
