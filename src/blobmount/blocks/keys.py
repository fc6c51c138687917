"""Block identity and block arithmetic. Pure.

Block k of a blob version is bytes [k*B, min((k+1)*B, size)). A block is only ever filled from
the version (ETag) in its key, so two versions can never mix inside one block or one read.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlobVersion:
    """One version of one blob: what an open handle is pinned to."""

    name: str
    etag: str
    size: int


@dataclass(frozen=True, slots=True)
class BlockKey:
    name: str
    etag: str
    index: int


def block_count(size: int, block_size: int) -> int:
    return -(-size // block_size)


def block_span(index: int, block_size: int, size: int) -> tuple[int, int]:
    """(start, length) of block `index` of a blob of `size` bytes."""
    start = index * block_size
    return start, max(0, min(block_size, size - start))


def blocks_covering(offset: int, length: int, block_size: int, size: int) -> range:
    """Indices of the blocks holding bytes [offset, offset+length), clipped to the blob."""
    end = min(offset + length, size)
    if length <= 0 or offset >= end:
        return range(0)
    return range(offset // block_size, (end - 1) // block_size + 1)
