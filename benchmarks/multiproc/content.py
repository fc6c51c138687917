"""The deterministic content of the spike's filesystem: every process computes the same bytes
from a file's index alone, so any process can answer any read and every read can be checked.

Small file `i` is a window of one pseudo-random pattern starting at `small_start(i)`; the big
file is the pattern repeated. The pattern's period is odd and not page-aligned, so a block
served at a wrong offset does not match.
"""

from __future__ import annotations

import random

#: content period (odd, not page aligned)
PERIOD = 1_048_573
#: the longest slice taken in one piece
MAX_READ = 1 << 20
#: the pattern every byte is taken from (period + one read, so a read is one slice)
PATTERN = random.Random(20261125).randbytes(PERIOD + MAX_READ)
#: inode of the root, and of small file 0 (file i is FIRST_INODE + i; the big file follows)
ROOT_INODE = 1
FIRST_INODE = 2


def small_start(index: int) -> int:
    """Where small file `index` starts in the pattern."""
    return (index * 40_503) % PERIOD


def big_inode(files: int) -> int:
    return FIRST_INODE + files


def small_bytes(index: int, offset: int, size: int, file_size: int) -> bytes:
    """Bytes [offset, offset+size) of small file `index` (of `file_size` bytes): one slice."""
    start = small_start(index) + offset
    return PATTERN[start : start + max(0, min(size, file_size - offset))]


def big_bytes(offset: int, size: int, file_size: int) -> bytes:
    """Bytes [offset, offset+size) of the big file (the pattern repeated)."""
    size = max(0, min(size, file_size - offset))
    out = bytearray()
    start = offset % PERIOD
    while size:
        part = min(size, MAX_READ)
        out += PATTERN[start : start + part]
        size -= part
        start = (start + part) % PERIOD
    return bytes(out)


def content(inode: int, files: int, offset: int, size: int, file_size: int) -> bytes:
    """The bytes of `inode` at [offset, offset+size), clipped to `file_size`."""
    if inode == big_inode(files):
        return big_bytes(offset, size, file_size)
    return small_bytes(inode - FIRST_INODE, offset, size, file_size)
