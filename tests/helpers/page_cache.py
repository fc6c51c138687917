"""Dropping one file's pages from the kernel's page cache, so its next reads reach the mount.

Per file (POSIX_FADV_DONTNEED), never the machine's `drop_caches`: the tests run in several
pytest-xdist processes at once, and a machine-wide drop makes another test's kernel read again
pages it had read ahead, which that test sees as extra bytes served.
"""

from __future__ import annotations

import os
from pathlib import Path


def drop_page_cache(path: Path) -> None:
    """Drop the pages of `path`, through an open of its own (which, for a one-block file opened
    for the first time, starts its GET: `read_file(path, drop_pages=True)` avoids that)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        drop_pages(fd)
    finally:
        os.close(fd)


def drop_pages(fd: int) -> None:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
