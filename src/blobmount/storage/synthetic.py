"""SyntheticStorageClient: a made-up container whose requests cost next to nothing.

A benchmark and test tool, not a way to reach data: it measures the mount where the mount is
the bottleneck. Against Azurite on a small machine the emulator spends more CPU per request than
the mount, so no change to the mount can show; a synthetic source answers a listing page or a
ranged GET with a few arithmetic steps and one copy.

Every name, size, ETag and byte follows from a `SyntheticDataset` alone, so any number of
processes built from the same URI serve the same container without sharing memory, and a
reader can check every byte it gets (`expected_bytes`). The layout:

    small/d0000/f0000000.bin ... small/dNNNN/fNNNNNNN.bin   `small_files` of `small_size` bytes,
                                                            `per_folder` to a folder
    large/f000.bin ...                                      `large_files` of `large_size` bytes

Byte `o` of file `i` (small files first, then large ones) is `PATTERN[(o + i * STRIDE) % len]`
for one pseudo-random pattern of odd length, so a block served at the wrong offset (offsets
differ by multiples of a power of two) or from the wrong file does not match.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import trio

from blobmount.errors import BlobChanged, BlobNotFound, SourceError
from blobmount.source import parse_synthetic_query
from blobmount.storage.base import (
    MAX_LIST_PAGE,
    BlobProps,
    ListPage,
    RangeWithProps,
    StorageClient,
)
from blobmount.storage.sorted_listing import LazyNames, sorted_text_page

#: odd, so that no offset error of a power-of-two multiple maps a byte onto an equal one
PATTERN_SIZE = 4 * 1024 * 1024 + 9
#: how far apart two consecutive files start in the pattern
STRIDE = 1_000_003
#: a fixed modification time (2026-01-01T00:00:00Z): the same in every process
MODIFIED = 1_767_225_600.0


@dataclass(frozen=True, slots=True)
class SyntheticDataset:
    """The whole description of a synthetic container."""

    small_files: int = 10_000
    small_size: int = 25_000
    per_folder: int = 1_000
    large_files: int = 0
    large_size: int = 1024 * 1024 * 1024
    seed: int = 0
    #: how long each ranged GET waits before it is answered: a network round trip that costs
    #: no CPU, so the time a file takes beyond its GET shows as it would against a real store
    latency_us: int = 0

    def __post_init__(self) -> None:
        if min(self.small_files, self.small_size, self.large_files, self.large_size) < 0:
            raise SourceError("synthetic:// counts and sizes must not be negative")
        if self.per_folder < 1:
            raise SourceError("synthetic:// per_folder must be at least 1")
        if self.small_files > 10**7 or self.large_files > 1000:
            raise SourceError("synthetic:// holds at most 10,000,000 small and 1,000 large files")
        if self.latency_us > 10_000_000:
            raise SourceError("synthetic:// latency_us is at most 10,000,000 (10 s)")

    @classmethod
    def from_query(cls, query: str) -> SyntheticDataset:
        """From a synthetic:// URI's query, e.g. `small_files=3000&small_size=25KB&large_files=1`
        (unset keys keep their defaults)."""
        return cls(**parse_synthetic_query(query))

    @property
    def files(self) -> int:
        return self.small_files + self.large_files

    def name(self, index: int) -> str:
        """The blob name of file `index` (small files first); names sort in index order."""
        if index < self.small_files:
            return f"small/d{index // self.per_folder:04d}/f{index:07d}.bin"
        return f"large/f{index - self.small_files:03d}.bin"

    def size(self, index: int) -> int:
        return self.small_size if index < self.small_files else self.large_size

    def etag(self, index: int) -> str:
        # the size is part of it: the disk cache keys entries by (name, ETag), and the same
        # name holds other bytes in a dataset of another size or file count
        key = f"{self.seed}:{index}:{self.size(index)}"
        digest = hashlib.blake2b(key.encode(), digest_size=8).hexdigest()
        return f'"0x{digest.upper()}"'

    def index_of(self, name: str) -> int | None:
        """The file a blob name stands for, or None when there is no such blob."""
        try:
            if name.startswith("small/d") and name.endswith(".bin"):
                index = int(name[13:-4])
            elif name.startswith("large/f") and name.endswith(".bin"):
                index = self.small_files + int(name[7:-4])
            else:
                return None
        except ValueError:
            return None
        in_range = 0 <= index < self.files
        return index if in_range and self.name(index) == name else None

    def props(self, index: int) -> BlobProps:
        return BlobProps(self.name(index), self.size(index), self.etag(index), MODIFIED)


class _Names(LazyNames[str]):
    """The dataset's names in sorted order, computed on demand (for `bisect`)."""

    def __init__(self, dataset: SyntheticDataset) -> None:
        self._dataset = dataset
        # large/ sorts before small/
        self._first_small = dataset.large_files

    def __len__(self) -> int:
        return self._dataset.files

    def file_at(self, position: int) -> int:
        """The file index at sorted `position`."""
        small = position - self._first_small
        return small if small >= 0 else self._dataset.small_files + position

    def name_at(self, position: int) -> str:
        return self._dataset.name(self.file_at(position))


class _Pattern:
    """The dataset's byte pattern, held twice over so that most ranges are one slice."""

    def __init__(self, seed: int) -> None:
        once = random.Random(seed).randbytes(PATTERN_SIZE)
        self._twice = once + once

    def read(self, index: int, start: int, length: int) -> bytes:
        origin = (start + index * STRIDE) % PATTERN_SIZE
        if length <= PATTERN_SIZE:
            return self._twice[origin : origin + length]
        parts, done = [], 0
        while done < length:
            take = min(PATTERN_SIZE, length - done)
            parts.append(self._twice[origin : origin + take])
            origin = (origin + take) % PATTERN_SIZE
            done += take
        return b"".join(parts)


_patterns: dict[int, _Pattern] = {}


def _pattern(seed: int) -> _Pattern:
    # one per seed and process: making it costs ~10 ms and 8 MiB
    if seed not in _patterns:
        _patterns[seed] = _Pattern(seed)
    return _patterns[seed]


def expected_bytes(dataset: SyntheticDataset, name: str, start: int, length: int) -> bytes:
    """What a correct reader gets from `name` at [start, start+length) (for verification)."""
    index = dataset.index_of(name)
    if index is None:
        raise KeyError(name)
    end = min(dataset.size(index), start + length)
    return _pattern(dataset.seed).read(index, start, max(0, end - start))


class SyntheticStorageClient(StorageClient):
    """A read-only container made up from a `SyntheticDataset`; blobs never change.

    `name` is the one of the URI (synthetic://<name>); it only keys the disk cache.
    """

    def __init__(self, dataset: SyntheticDataset, name: str = "synthetic") -> None:
        self.dataset = dataset
        self.location = f"synthetic/{name}"
        self._names = _Names(dataset)
        self._pattern = _pattern(dataset.seed)

    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        continuation: str | None = None,
        max_results: int = MAX_LIST_PAGE,
    ) -> ListPage:
        await trio.lowlevel.checkpoint()
        names, dataset = self._names, self.dataset
        return sorted_text_page(
            names,
            lambda position: dataset.props(names.file_at(position)),
            prefix,
            delimiter,
            continuation,
            max_results,
        )

    async def get_properties(self, name: str) -> BlobProps:
        await trio.lowlevel.checkpoint()
        return self.dataset.props(self._index(name))

    async def get_range(self, name: str, etag: str, start: int, length: int) -> bytes:
        if self.dataset.latency_us:
            await trio.sleep(self.dataset.latency_us / 1e6)
        else:
            await trio.lowlevel.checkpoint()
        index = self._index(name)
        if etag != self.dataset.etag(index):
            raise BlobChanged(f"blob changed: {name}")
        end = min(self.dataset.size(index), start + length)
        return self._pattern.read(index, start, max(0, end - start))

    async def get_range_with_props(
        self, name: str, etag: str, start: int, length: int
    ) -> RangeWithProps:
        data = await self.get_range(name, etag, start, max(0, length))
        return RangeWithProps(data, self.dataset.props(self._index(name)))

    def _index(self, name: str) -> int:
        index = self.dataset.index_of(name)
        if index is None:
            raise BlobNotFound(f"blob not found: {name}")
        return index
