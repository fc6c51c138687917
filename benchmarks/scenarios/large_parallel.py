"""Scenario 2: the large file read once by 8 threads, each its own contiguous part.

The seed's "Reading large file one time from multiple threads (processing partitioned csv file
in multiple threads)". Each thread opens the file itself, as a partitioned reader would.
"""

from __future__ import annotations

from scenarios import register
from scenarios.base import Workload
from scenarios.datasets import Datasets
from scenarios.lineup import MountScenario
from scenarios.plans import (
    TWO_PROCESSES,
    FileJob,
    MiB,
    MountPlan,
    Profile,
    Read,
    chunked,
    seed_block_settings,
    whole_blob_ceilings,
)

READ_SIZE = 1 * MiB
THREADS = 8


class LargeParallel(MountScenario):
    name = "large-parallel"
    number = 2
    title = f"Large file, read once by {THREADS} threads, each a contiguous part (1 MiB reads)"
    mount_env = seed_block_settings()
    settings_note = (
        "seed: block cache on, disk cache off, memory cache 0 (READ_BUFFER_BLOCK_COUNT default)"
    )
    # the same read-ahead bytes (32 x 2 MiB) in blocks above Azurite's 4 MiB MD5 threshold
    mount_variants = {
        **TWO_PROCESSES,
        "blobmount-8MiB": {
            "DATASET_MOUNT_READ_BLOCK_SIZE": "8MB",
            "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT": "8",
        },
    }

    def workload(self, datasets: Datasets, profile: Profile) -> Workload:
        large = datasets.large()
        # parts of whole MiBs, so every read is 1 MiB except the file's last
        part = -(-large.size // THREADS // READ_SIZE) * READ_SIZE
        jobs = tuple(
            FileJob(
                large.blob,
                tuple(
                    Read(o, n, o)
                    for o, n in chunked(start, min(part, large.size - start), READ_SIZE)
                ),
            )
            for start in range(0, large.size, part)
        )
        return Workload(
            store=large.store,
            requested_bytes=large.size,
            files=1,
            source=large.source,
            mount=MountPlan(
                jobs,
                len(jobs),
                f"{len(jobs)} threads, each opens the file and reads its part in 1 MiB preadv",
            ),
            ceilings=whole_blob_ceilings(large.blob, large.etag, large.size),
        )


register(LargeParallel())
