"""Scenario 4: the small files over several epochs, each a random 25% of them, on one mount.

The seed's "Reading millions of small files (images) from multiple threads multiple times
(multiple epochs training on images)": 500K files of 25 KB, each epoch reads 25% randomly
selected files, 10 epochs; its table has listing, first epoch, last epoch and total (the epochs
only: its average per epoch is total / 10). Scaled down to scenario 3's small files.

One mount for the whole run: the loader first indexes the dataset (os.walk through the mount,
the "listing" phase, reported apart from the total), then each epoch's 16 threads read that
epoch's sample, each file whole, once. The kernel's caches are dropped before every phase, so a
later epoch is faster only by what the system itself kept: blobmount its RAM tier and disk tier,
rclone-full its VFS cache on disk, rclone-off nothing but its directory cache.

`blobmount-kept` and `rclone-full-kept` run the same epochs with the kernel's caches dropped
once, before the run: a training job's node does not drop its page cache between epochs, so
these rows are what such a job sees. blobmount opens files with the kernel's keep-cache flag (a
blob version never changes), so a file read in an earlier epoch can come from the page cache
without a request to the daemon; whether rclone's reads do is rclone's own choice.

Samples are drawn independently (one fixed seed, a new sample every epoch), as the seed's test
does, so epoch k finds only 1 - 0.75^(k-1) of its files read before: 58% in epoch 4 (quick),
92% in epoch 10. Even with free cache hits the last epoch of a quick run cannot be more than
1 / 0.42 = 2.4x faster than the first (13x in a full run).

The ceiling lists the container flat with the client, then fetches each epoch's files directly
(one GET each, 32 at once); it keeps nothing, so all its epochs cost the same.
"""

from __future__ import annotations

import random

from scenarios import register
from scenarios.base import Workload
from scenarios.datasets import Datasets
from scenarios.lineup import MountScenario
from scenarios.plans import CeilingPlan, FileJob, MountPlan, Phase, Profile, RangeGet
from scenarios.small_files import CEILING_CONCURRENCY, THREADS, whole_files

#: each epoch reads this share of the files
SAMPLE = 0.25


class MultiEpoch(MountScenario):
    name = "multi-epoch"
    number = 4
    title = (
        f"Many small files over several epochs, each a random {SAMPLE:.0%} of them read by "
        f"{THREADS} threads, one mount"
    )
    mount_env = {
        "DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "true",
        "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED": "true",
    }
    settings_note = (
        "seed: block cache on, other settings default: disk cache on, memory cache 128 MB; "
        "blobmount-whole-file: whole-file mode (DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=false), "
        "later epochs from its local copies"
    )
    whole_file_rows = True
    # the disk tier alone: what a later epoch gets once the RAM tier cannot hold the dataset
    mount_variants = {"blobmount-ram0": {"DATASET_MOUNT_MEMORY_CACHE_SIZE": "0"}}
    # and as a training job sees it: the node's page cache is not dropped between epochs
    kept_cache_variants = True

    def workload(self, datasets: Datasets, profile: Profile) -> Workload:
        small = datasets.small()
        rng = random.Random(f"blobmount-bench-epochs-{len(small.names)}")
        per_epoch = max(1, int(len(small.names) * SAMPLE))
        listing = Phase("listing", listing=frozenset(small.names), in_total=False)
        mount_phases, ceiling_phases = [listing], [listing]
        jobs: list[FileJob] = []
        steps: list[tuple[RangeGet, ...]] = []
        dest = 0
        for epoch in range(1, profile.epochs + 1):
            sample = rng.sample(range(len(small.names)), per_epoch)
            epoch_jobs, gets = whole_files(small, sample, dest)
            dest += sum(small.sizes[i] for i in sample)
            jobs.extend(epoch_jobs)
            steps.append(gets)
            mount_phases.append(Phase(f"epoch {epoch}", len(epoch_jobs)))
            ceiling_phases.append(Phase(f"epoch {epoch}", 1))
        return Workload(
            store=small.store,
            requested_bytes=dest,
            files=len(jobs),
            source=small.source,
            mount=MountPlan(
                tuple(jobs),
                THREADS,
                f"os.walk of the mount, then {profile.epochs} epochs of {per_epoch:,} files: "
                f"{THREADS} threads take the epoch's files from one queue (open, one read, close)",
                tuple(mount_phases),
            ),
            ceilings={
                "ceiling": CeilingPlan(
                    tuple(steps),
                    CEILING_CONCURRENCY,
                    "AzureStorageClient: a flat listing of the container, then per epoch one GET "
                    f"per file, {CEILING_CONCURRENCY} at once, into memory (no cache)",
                    tuple(ceiling_phases),
                )
            },
        )


register(MultiEpoch())
