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
#: the processes share list pages (storage/shared_pages.py), but each builds its own catalog
#: from them (its counts of pages and walks), and the start-up check lists in a child process
#: whose requests the stats do not count
LISTS_PER_PROCESS = pytest.mark.single_process(
    "each process keeps its own catalog (pages, walks), and the start-up check's list request "
    "is made in a child: counts differ"
)
#: a small file's bytes go into the kernel's page cache with its first open only where one
#: process answers every request: in a multi-process mount its READ may come to another
PAGE_CACHE_AT_OPEN = pytest.mark.single_process(
    "a small file's bytes are stored in the kernel's page cache at its open only with one process"
)
