"""The synthetic group: the S1, S2 and S3 shapes on a synthetic:// source, where the mount is
the bottleneck (issue #25), and their ceiling.

A synthetic:// source answers a listing or a GET with a few arithmetic steps in the daemon
itself (`blobmount.storage.synthetic`), so no emulator shares the two cores and what is
measured is the mount's own CPU per file and per GiB. Every read is checked against
`expected_bytes` after the clock stops.

The ceiling of this source is the daemon's own storage client, `SyntheticStorageClient`, called
in this process on trio with no FUSE: the same GETs, one after another (nothing waits on I/O, so
concurrency would only add scheduling). Its ratio is far above any mount: the figure to watch
here is the mount's CPU per file and per GiB, and (issue #25) how it changes with processes.
Run by `benchmarks/synthetic.py`; scenarios here are not registered with `run.py`, which runs
everything against Azurite.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from blobmount.source import parse_source
from blobmount.storage.synthetic import SyntheticDataset, SyntheticStorageClient, expected_bytes
from scenarios.large_parallel import LargeParallel
from scenarios.large_sequential import LargeSequential
from scenarios.plans import FileJob, MiB, MountPlan, RangeGet, Read, chunked
from scenarios.small_files import SmallFiles

#: the seed's small-file shape (S3): files of 25 KB, folders of 1,000
SMALL_SIZE = 25_000
PER_FOLDER = 1_000
READ_SIZE = 1 * MiB
#: the ceiling's GET size for the large file (as the Azure ceiling's)
CEILING_PIECE = 8 * MiB
NAME = "bench"


@dataclass(frozen=True, slots=True)
class SyntheticProfile:
    """How big the synthetic dataset is (`--quick` or full)."""

    name: str
    small_files: int
    large_bytes: int


FULL = SyntheticProfile("full", small_files=20_000, large_bytes=1024 * MiB)
QUICK = SyntheticProfile("quick", small_files=5_000, large_bytes=256 * MiB)


def dataset_uri(profile: SyntheticProfile) -> str:
    """The one source every scenario of the group mounts."""
    return (
        f"synthetic://{NAME}?small_files={profile.small_files}&small_size={SMALL_SIZE}"
        f"&per_folder={PER_FOLDER}&large_files=1&large_size={profile.large_bytes}"
    )


def dataset_of(uri: str) -> SyntheticDataset:
    """The dataset a synthetic:// URI describes, as the daemon builds it."""
    return SyntheticDataset.from_query(parse_source(uri).synthetic_query or "")


@dataclass(frozen=True, slots=True)
class SyntheticWorkload:
    """One scenario's reads through the mount, and the same bytes as GETs for the ceiling."""

    plan: MountPlan
    gets: tuple[RangeGet, ...]
    files: int
    requested_bytes: int


@dataclass(frozen=True, slots=True)
class SyntheticScenario:
    """One shape of the group: what the readers do, and the mount's settings for it (those of
    the matching Azurite scenario, so the figures compare with RESULTS.md)."""

    name: str
    #: "small" (rates in files/s, CPU per file) or "large" (GiB/s, CPU per GiB)
    kind: str
    title: str
    readers: int
    mount_env: Mapping[str, str] = field(default_factory=dict)
    #: files hinted ahead of the readers (`blobmount.hints.client.hinted`), 0 for no hints
    hint_window: int = 0

    def workload(self, dataset: SyntheticDataset) -> SyntheticWorkload:
        if self.kind == "small":
            return _small_files(dataset, self.readers)
        return _large_file(dataset, self.readers)


def _small_files(dataset: SyntheticDataset, readers: int) -> SyntheticWorkload:
    """Every small file once, whole: open, one read, close (S3)."""
    jobs, gets, dest = [], [], 0
    for index in range(dataset.small_files):
        name, size = dataset.name(index), dataset.size(index)
        jobs.append(FileJob(name, (Read(0, size, dest),)))
        gets.append(RangeGet(name, dataset.etag(index), 0, size, dest))
        dest += size
    what = f"{readers} reader thread(s) take files from one queue: open, one read, close"
    return SyntheticWorkload(MountPlan(tuple(jobs), readers, what), tuple(gets), len(jobs), dest)


def _large_file(dataset: SyntheticDataset, readers: int) -> SyntheticWorkload:
    """The large file in 1 MiB reads: one reader in order (S1), or `readers` each its own
    contiguous part (S2)."""
    index = dataset.small_files
    name, size, etag = dataset.name(index), dataset.size(index), dataset.etag(index)
    part = -(-size // readers // READ_SIZE) * READ_SIZE
    jobs = tuple(
        FileJob(
            name,
            tuple(Read(o, n, o) for o, n in chunked(start, min(part, size - start), READ_SIZE)),
        )
        for start in range(0, size, part)
    )
    what = (
        "1 reader thread, 1 MiB preadv in order"
        if len(jobs) == 1
        else f"{len(jobs)} threads, each opens the file and reads its part in 1 MiB preadv"
    )
    gets = tuple(RangeGet(name, etag, o, n, o) for o, n in chunked(0, size, CEILING_PIECE))
    return SyntheticWorkload(MountPlan(jobs, len(jobs), what), gets, 1, size)


SCENARIOS: tuple[SyntheticScenario, ...] = (
    *(
        SyntheticScenario(
            f"synthetic-small-{readers}",
            "small",
            f"S3 shape: {SMALL_SIZE:,}-byte files, each read once by {readers} reader(s)",
            readers,
            SmallFiles.mount_env,
        )
        for readers in (16, 4, 1)
    ),
    # whole-file mode (issue #29): the same files, each downloaded whole into the cache folder
    *(
        SyntheticScenario(
            f"synthetic-whole-small-{readers}",
            "small",
            f"S3 shape in whole-file mode, {readers} reader(s)",
            readers,
            {**SmallFiles.mount_env, "DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "false"},
        )
        for readers in (16, 1)
    ),
    # read-order hints (small-files-hinted's shape): the mount fetches ahead of 4 readers
    SyntheticScenario(
        "synthetic-hinted-small-4",
        "small",
        "S3 shape, 4 readers, their order hinted 512 files ahead",
        4,
        SmallFiles.mount_env,
        hint_window=512,
    ),
    SyntheticScenario(
        "synthetic-large-sequential",
        "large",
        "S1 shape: the large file read once in order by one reader (1 MiB reads)",
        1,
        LargeSequential.mount_env,
    ),
    SyntheticScenario(
        "synthetic-large-parallel",
        "large",
        "S2 shape: the large file read once by 8 readers, each its own part (1 MiB reads)",
        8,
        LargeParallel.mount_env,
    ),
)


def mismatch(plan: MountPlan, buf: bytearray, dataset: SyntheticDataset) -> str | None:
    """None if every read of `plan` put the dataset's bytes at its place in `buf`."""
    view = memoryview(buf)
    for job in plan.jobs:
        for r in job.reads:
            want = expected_bytes(dataset, job.blob, r.offset, r.length)
            if bytes(view[r.dest : r.dest + r.length]) != want:
                return f"{job.blob}, somewhere in bytes {r.offset}-{r.offset + r.length - 1}"
    return None


@dataclass(frozen=True, slots=True)
class CeilingRun:
    seconds: float
    cpu_s: float
    verified: bool


def run_ceiling(dataset: SyntheticDataset, gets: tuple[RangeGet, ...]) -> CeilingRun:
    """The GETs done directly with `SyntheticStorageClient` on trio, into memory; every piece
    is checked after the clock stops."""
    import trio

    client = SyntheticStorageClient(dataset, NAME)
    pieces: list[bytes] = []

    async def main() -> tuple[float, float]:
        started, cpu0 = time.perf_counter(), time.process_time()
        pieces.extend([await client.get_range(g.blob, g.etag, g.offset, g.length) for g in gets])
        return time.perf_counter() - started, time.process_time() - cpu0

    seconds, cpu = trio.run(main)
    verified = all(
        piece == expected_bytes(dataset, get.blob, get.offset, get.length)
        for get, piece in zip(gets, pieces, strict=True)
    )
    return CeilingRun(seconds, cpu, verified)
