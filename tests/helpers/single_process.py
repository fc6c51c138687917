"""Why a mount test asserts what only a one-process mount does. `make test-processes` runs the
mount tests with 2 processes and leaves these out; each reason is a part of the multi-process
mount not built yet (docs/developer-notes/multicore.md, "Not built yet")."""

import os

import pytest

#: the processes every mount of this test run has (BLOBMOUNT_TEST_WORKER_PROCESSES)
PROCESSES = int(os.environ.get("BLOBMOUNT_TEST_WORKER_PROCESSES") or 1)

#: each process has its own RAM tier and read-ahead: a block two processes read is fetched by
#: both, and a whole file by each process that opens or reads it
FETCHES_PER_PROCESS = pytest.mark.single_process(
    "each process fetches the blocks (and whole files) it serves: counts of GETs and bytes differ"
)
#: each process lists the folders it serves on its own, when it first needs them: counts of
#: list pages differ, and so do the views of a folder that changed between two processes'
#: listings (a folder handle read in both can then repeat or miss an entry)
LISTS_PER_PROCESS = pytest.mark.single_process(
    "each process lists the folders it serves: counts of list pages, and views taken at "
    "different times, differ"
)
#: each process has its own flow controller and breaker; the stats show the main process's
FLOW_PER_PROCESS = pytest.mark.single_process(
    "each process backs off on its own: the breaker state reported is the main process's"
)
#: the hints socket is the main process's: it prefetches into its own RAM tier
HINTS_IN_MAIN = pytest.mark.single_process(
    "hinted blocks are fetched into the main process's RAM tier only"
)
