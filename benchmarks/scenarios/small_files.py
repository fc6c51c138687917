"""Scenario 3: many small files (~25 KB) read once by 16 threads.

The seed's "Reading millions of small files (images) from multiple threads one time (single epoch
training on images)", scaled down. Readers know the file names (as a data loader's index does),
so no listing is timed; each open still looks the name up through the mount.
"""

from __future__ import annotations

from collections.abc import Iterable

from scenarios import register
from scenarios.base import (
    CeilingPlan,
    FileJob,
    MountPlan,
    Profile,
    RangeGet,
    Read,
    Scenario,
    Workload,
    seed_block_settings,
)
from scenarios.datasets import Datasets, ManyFiles

THREADS = 16
#: the ceiling's GETs in flight; more did not help against Azurite here (it is the bottleneck)
CEILING_CONCURRENCY = 32


def whole_files(
    files: ManyFiles, indices: Iterable[int], dest: int
) -> tuple[tuple[FileJob, ...], tuple[RangeGet, ...]]:
    """Each file of `indices` read whole, once: an open, one read, a close through a mount, and
    one GET for a ceiling; their bytes follow one another in the result buffer from `dest`."""
    jobs, gets = [], []
    for i in indices:
        name, size = files.names[i], files.sizes[i]
        jobs.append(FileJob(name, (Read(0, size, dest),)))
        gets.append(RangeGet(name, files.etags[i], 0, size, dest))
        dest += size
    return tuple(jobs), tuple(gets)


class SmallFiles(Scenario):
    name = "small-files"
    number = 3
    title = f"Many small files (~25 KB), each read once by {THREADS} threads"
    mount_env = seed_block_settings()
    settings_note = "seed: disk cache off, memory cache 0 (block cache on)"
    threads = THREADS

    def workload(self, datasets: Datasets, profile: Profile) -> Workload:
        small = datasets.small()
        jobs, gets = whole_files(small, range(len(small.names)), 0)
        return Workload(
            store=small.store,
            requested_bytes=small.total_bytes,
            files=len(jobs),
            source=small.source,
            mount=MountPlan(
                jobs,
                self.threads,
                f"{self.threads} threads take files from one queue: open, one read, close",
            ),
            ceilings={
                "ceiling": CeilingPlan(
                    (gets,),
                    CEILING_CONCURRENCY,
                    f"AzureStorageClient, one GET per file (names and ETags known), "
                    f"{CEILING_CONCURRENCY} at once, into memory",
                )
            },
        )


class SmallFilesHinted(SmallFiles):
    """Issue #11: a reader with little parallelism of its own, with and without telling the
    mount its order. Without hints it is limited by its 4 threads; with them the mount fetches
    ahead across files (DATASET_MOUNT_HINT_THREADS at once)."""

    name = "small-files-hinted"
    title = "Many small files (~25 KB), read once by 4 threads, with and without read-order hints"
    settings_note = (
        "seed: disk cache off, memory cache 0 (block cache on); blobmount-hints: the readers' "
        "order hinted 512 files ahead, hint settings default"
    )
    threads = 4
    hinted_variants = {"blobmount-hints": 512}


register(SmallFiles())
register(SmallFilesHinted())
