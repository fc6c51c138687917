"""A new file of zeros mapped into memory, for state the processes of one mount share.

Made by the main process before it forks, so every process inherits the descriptor and the
mapping (a MAP_SHARED mapping: a store by one process is seen by all). The file is sparse:
pages take memory only once written.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path


def create_mapped(path: Path, length: int) -> tuple[int, mmap.mmap]:
    """The descriptor and a shared mapping of a new file of `length` zero bytes at `path`
    (which must not exist)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        os.ftruncate(fd, length)
        return fd, mmap.mmap(fd, length)
    except BaseException:
        os.close(fd)
        raise
