"""Scenario 1: one large file read sequentially, once, by one reader in 1 MiB reads.

The seed's "Reading large file sequentially one time (processing lines in csv file)".
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


class LargeSequential(MountScenario):
    name = "large-sequential"
    number = 1
    title = "Large file, read sequentially once by one reader (1 MiB reads)"
    mount_env = seed_block_settings(DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT="80")
    settings_note = (
        "seed: block cache on, disk cache off, memory cache 0, READ_BUFFER_BLOCK_COUNT 80"
    )
    # the same read-ahead bytes (160 MiB) in blocks above Azurite's 4 MiB MD5 threshold
    mount_variants = {
        **TWO_PROCESSES,
        "blobmount-8MiB": {
            "DATASET_MOUNT_READ_BLOCK_SIZE": "8MB",
            "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT": "20",
        },
    }

    def workload(self, datasets: Datasets, profile: Profile) -> Workload:
        large = datasets.large()
        reads = tuple(Read(o, n, o) for o, n in chunked(0, large.size, READ_SIZE))
        return Workload(
            store=large.store,
            requested_bytes=large.size,
            files=1,
            source=large.source,
            mount=MountPlan(
                (FileJob(large.blob, reads),), 1, "1 reader thread, 1 MiB preadv in order"
            ),
            ceilings=whole_blob_ceilings(large.blob, large.etag, large.size),
        )


register(LargeSequential())
