"""What a run reads: the sizes of a run (`Profile`) and the plans a scenario hands to its systems.

A `MountPlan` is files opened and read through a mount by reader threads; a `CeilingPlan` is the
same bytes fetched directly with `AzureStorageClient`. Every read names its blob and offset, and
lands at a fixed place (`dest`) of one result buffer, so a run is verified afterwards read by
read against the generated content of each blob.

A plan may be cut into `Phase`s, timed and reported one by one on the same mount (multi-epoch:
a listing, then one phase per epoch); a plan without phases is timed as one piece.

The bottom of the harness: plain values and the helpers scenarios build plans with; it imports
nothing of the benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

#: the mount's default block size (DATASET_MOUNT_READ_BLOCK_SIZE)
DEFAULT_BLOCK_SIZE = 2 * MiB


@dataclass(frozen=True, slots=True)
class Profile:
    """Dataset and workload sizes for one run (`--quick` or full)."""

    name: str
    large_file_bytes: int
    small_file_count: int
    seek_chunks: int
    #: multi-epoch: epochs on one mount (the seed runs 10)
    epochs: int
    #: download: files of MEDIUM_FILE_BYTES (the seed's "100 x 1GB" next to "1 x 100GB")
    medium_file_count: int


#: sized for a 2-core, 24 GiB machine: the full run stays within ~15 minutes. Issue #9 suggested
#: 20,000 small files; Azurite's per-request CPU grows with the blobs it holds (7.8 ms per GET at
#: 20,000 against 1.3 ms at 1,000), so at 20,000 the scenario measures Azurite's lookups, not the
#: mount, and takes over 15 minutes alone. `--small-files 20000` still runs it.
FULL = Profile(
    "full",
    large_file_bytes=2 * GiB,
    small_file_count=10_000,
    seek_chunks=1_000,
    epochs=10,
    medium_file_count=128,
)
QUICK = Profile(
    "quick",
    large_file_bytes=512 * MiB,
    small_file_count=4_000,
    seek_chunks=300,
    epochs=4,
    medium_file_count=32,
)


# -- plans -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Read:
    """Read `length` bytes at `offset` of a file into the result buffer at `dest`."""

    offset: int
    length: int
    dest: int


@dataclass(frozen=True, slots=True)
class FileJob:
    """Open one file (by blob name, relative to the mount root), do `reads` in order, close."""

    blob: str
    reads: tuple[Read, ...]


@dataclass(frozen=True, slots=True)
class Phase:
    """A part of a run that is timed and reported on its own.

    The phases of a plan run in order on the same mount (the same client, for a ceiling), so a
    later phase gets whatever the system cached in an earlier one; the kernel's caches are
    dropped before each phase (untimed), so that is the system's own caching. A phase runs the
    plan's next `count` jobs (MountPlan) or steps (CeilingPlan); a listing phase runs none and
    lists the whole dataset instead (os.walk through a mount, a flat listing with the client),
    which must find exactly the blobs in `listing`.
    """

    name: str
    count: int = 0
    listing: frozenset[str] | None = None
    #: whether its time is part of the run's time (the seed reports the listing apart)
    in_total: bool = True


T = TypeVar("T")


def phase_items(phases: Sequence[Phase], items: Sequence[T]) -> list[tuple[Phase, Sequence[T]]]:
    """Each phase with its share of a plan's jobs or steps; no phases = one phase of them all."""
    if not phases:
        return [(Phase("all", len(items)), items)]
    out, start = [], 0
    for phase in phases:
        out.append((phase, items[start : start + phase.count]))
        start += phase.count
    if start != len(items):
        raise ValueError(f"the phases cover {start} of the plan's {len(items)} items")
    return out


@dataclass(frozen=True, slots=True)
class MountPlan:
    """`threads` reader threads take jobs from one shared queue, in order, until it is empty
    (phase by phase, when it has phases)."""

    jobs: tuple[FileJob, ...]
    threads: int
    description: str
    phases: tuple[Phase, ...] = ()


@dataclass(frozen=True, slots=True)
class RangeGet:
    """One `get_range` call; its bytes belong at `dest` of the result buffer."""

    blob: str
    etag: str
    offset: int
    length: int
    dest: int


@dataclass(frozen=True, slots=True)
class CeilingPlan:
    """Steps run one after another; the GETs of a step run `concurrency` at a time.

    One step holding every GET is "fetch all of it as fast as you can"; one step per chunk keeps
    a reader's order (chunk i+1 is asked for only once chunk i is in memory).
    """

    steps: tuple[tuple[RangeGet, ...], ...]
    concurrency: int
    description: str
    phases: tuple[Phase, ...] = ()


# -- plan helpers shared by scenarios ----------------------------------------------------------


def chunked(offset: int, length: int, piece: int) -> list[tuple[int, int]]:
    """(offset, length) pieces of at most `piece` bytes covering [offset, offset+length)."""
    return [(o, min(piece, offset + length - o)) for o in range(offset, offset + length, piece)]


def whole_blob_ceilings(blob: str, etag: str, size: int) -> dict[str, CeilingPlan]:
    """The ceilings for reading one whole blob: the best request shape for this backend, and
    (as a diagnostic) the mount's own request shape.

    8 MiB GETs, 8 at once, were the fastest shape measured against Azurite here. Azurite 3.35
    MD5-hashes (and reads twice) any range of 4 MiB or less even when nobody asked for the hash,
    so ranges above 4 MiB are several times cheaper for it; see docs/BENCHMARKING.md.
    """

    def plan(piece: int, concurrency: int, description: str) -> CeilingPlan:
        gets = tuple(RangeGet(blob, etag, o, n, o) for o, n in chunked(0, size, piece))
        return CeilingPlan((gets,), concurrency, description)

    return {
        "ceiling": plan(8 * MiB, 8, "AzureStorageClient, 8 MiB GETs, 8 at once, into memory"),
        "ceiling-2MiB": plan(
            DEFAULT_BLOCK_SIZE,
            8,
            "diagnostic: AzureStorageClient, 2 MiB GETs (the mount's block size), 8 at once "
            "(the mount's default READ_THREADS on 2 cores)",
        ),
    }


#: a diagnostic mount served by two processes (issue #25): the same settings, and
#: DATASET_MOUNT_WORKER_PROCESSES=2; its CPU is the whole process tree's
TWO_PROCESSES = {"blobmount-2p": {"DATASET_MOUNT_WORKER_PROCESSES": "2"}}


def seed_block_settings(**extra: str) -> dict[str, str]:
    """The seed's settings for one-pass reads: blocks, no disk cache, no RAM cache."""
    env = {
        "DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "true",
        "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED": "false",
        "DATASET_MOUNT_MEMORY_CACHE_SIZE": "0",
    }
    env.update(extra)
    return env
