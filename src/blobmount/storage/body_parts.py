"""Cutting a ranged GET's answer into consecutive parts (the blocks of a coalesced read-ahead).

Read whole and then sliced, every byte of a coalesced answer is copied twice: once when the body
is joined from the chunks the socket delivered, once more into its block. `PartCutter` takes the
chunks as they arrive and joins each part straight from them, so every byte is copied once. On a
sequential read of 2 MiB blocks fetched 8 MiB at a time, the second copy was a quarter of the
daemon's GIL time (py-spy, native frames).
"""

from __future__ import annotations

from collections.abc import Sequence


def split_parts(data: bytes, lengths: Sequence[int]) -> list[bytes]:
    """`data` cut into parts of `lengths` (copies); shorter or missing at the end if it ends
    first, as a range read does at the end of a blob."""
    cutter = PartCutter(0, lengths)
    cutter.feed(data)
    return cutter.finish()


class PartCutter:
    """Feed it a body chunk by chunk; it keeps bytes [skip, skip + sum(lengths)) of it as parts
    of `lengths`, and counts the body's length."""

    def __init__(self, skip: int, lengths: Sequence[int]) -> None:
        if skip < 0 or not lengths or min(lengths) <= 0:
            raise ValueError(f"cannot cut parts of {lengths!r} after {skip} bytes")
        self._skip = skip
        self._lengths = lengths
        self._index = 0
        self._need = lengths[0] if lengths else 0
        self._pieces: list[bytes | memoryview] = []
        self._parts: list[bytes] = []
        self.body_bytes = 0

    def feed(self, chunk: bytes) -> None:
        self.body_bytes += len(chunk)
        start = min(self._skip, len(chunk))
        self._skip -= start
        while start < len(chunk) and self._index < len(self._lengths):
            take = min(self._need, len(chunk) - start)
            if take == len(chunk):
                self._pieces.append(chunk)  # joined alone, a whole chunk is not copied
            else:
                self._pieces.append(memoryview(chunk)[start : start + take])
            start += take
            self._need -= take
            if self._need == 0:
                self._end_part()

    def _end_part(self) -> None:
        self._parts.append(b"".join(self._pieces))
        self._pieces = []
        self._index += 1
        self._need = self._lengths[self._index] if self._index < len(self._lengths) else 0

    def finish(self) -> list[bytes]:
        """The parts: all of them, unless the body ended first (then the last is short)."""
        if self._pieces:
            self._end_part()
        return self._parts
