"""Deterministic test data that can be checked at any offset without keeping a copy.

The byte stream of (seed) is cut into 64 KiB chunks; chunk c is random bytes seeded by
(seed, c), so `pattern_bytes(seed, offset, size)` is cheap for any range.
"""

from __future__ import annotations

import hashlib
import random

CHUNK = 64 * 1024


def _chunk(seed: str, index: int) -> bytes:
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little")).randbytes(CHUNK)


def pattern_bytes(seed: str, offset: int, size: int) -> bytes:
    """Bytes [offset, offset+size) of the infinite stream named `seed`."""
    if size <= 0:
        return b""
    first, last = offset // CHUNK, (offset + size - 1) // CHUNK
    data = b"".join(_chunk(seed, c) for c in range(first, last + 1))
    start = offset - first * CHUNK
    return data[start : start + size]


def pattern_sha256(seed: str, size: int) -> str:
    h = hashlib.sha256()
    for off in range(0, size, 16 * CHUNK):
        h.update(pattern_bytes(seed, off, min(16 * CHUNK, size - off)))
    return h.hexdigest()
