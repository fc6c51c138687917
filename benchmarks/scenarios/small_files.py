"""Scenario 3: many small files (~25 KB) read once by 16 threads.

The seed's "Reading millions of small files (images) from multiple threads one time (single epoch
training on images)", scaled down. Readers know the file names (as a data loader's index does),
so no listing is timed; each open still looks the name up through the mount.
"""

from __future__ import annotations

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
from scenarios.datasets import Datasets

THREADS = 16
#: the ceiling's GETs in flight; more did not help against Azurite here (it is the bottleneck)
CEILING_CONCURRENCY = 32


class SmallFiles(Scenario):
    name = "small-files"
    number = 3
    title = f"Many small files (~25 KB), each read once by {THREADS} threads"
    mount_env = seed_block_settings()
    settings_note = "seed: disk cache off, memory cache 0 (block cache on)"

    def workload(self, datasets: Datasets, profile: Profile) -> Workload:
        small = datasets.small()
        files = zip(small.names, small.sizes, small.offsets, small.etags, strict=True)
        jobs, gets = [], []
        for name, size, offset, etag in files:
            jobs.append(FileJob(name, (Read(0, size, offset),)))
            gets.append(RangeGet(name, etag, 0, size, offset))
        return Workload(
            store=small.store,
            requested_bytes=small.total_bytes,
            files=len(jobs),
            source=small.source,
            mount=MountPlan(
                tuple(jobs),
                THREADS,
                f"{THREADS} threads take files from one queue: open, one read, close",
            ),
            ceilings={
                "ceiling": CeilingPlan(
                    (tuple(gets),),
                    CEILING_CONCURRENCY,
                    f"AzureStorageClient, one GET per file (names and ETags known), "
                    f"{CEILING_CONCURRENCY} at once, into memory",
                )
            },
        )


register(SmallFiles())
