"""Scenario 3: many small files (~25 KB) read once by 16 threads.

The seed's "Reading millions of small files (images) from multiple threads one time (single epoch
training on images)", scaled down. Readers know the file names (as a data loader's index does),
so no listing is timed; each open still looks the name up through the mount.
"""

from __future__ import annotations

from collections.abc import Iterable

from scenarios import register
from scenarios.base import System, Workload
from scenarios.datasets import Datasets, ManyFiles, Store
from scenarios.lineup import MountScenario
from scenarios.plans import (
    TWO_PROCESSES,
    CeilingPlan,
    FileJob,
    MountPlan,
    Profile,
    RangeGet,
    Read,
    seed_block_settings,
)

THREADS = 16
#: added to every response in the latency variant: a small GET's time to first byte from a VM
#: in the storage account's region is several to tens of milliseconds
LATENCY_MS = 10.0
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


class SmallFiles(MountScenario):
    name = "small-files"
    number = 3
    title = f"Many small files (~25 KB), each read once by {THREADS} threads"
    mount_env = seed_block_settings()
    settings_note = (
        "seed: disk cache off, memory cache 0 (block cache on); blobmount-whole-file: the same "
        "in whole-file mode (DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=false, disk cache default); "
        "-1r, -4r: read by 1 and 4 threads (a DataLoader worker reads with one), rclone-off "
        "too; ceiling-1r, -4r: the ceiling's GETs 1 and 4 at a time"
    )
    threads = THREADS
    whole_file_rows = True
    reader_rows = (1, 4)
    mount_variants = TWO_PROCESSES

    def workload(self, datasets: Datasets, profile: Profile) -> Workload:
        small = datasets.small()
        return self.read_each_once(small, small.store, len(small.names))

    def read_each_once(self, small: ManyFiles, store: Store, count: int) -> Workload:
        """The first `count` files, each read once, from `store` (maybe behind a proxy)."""
        jobs, gets = whole_files(small, range(count), 0)
        late = f"; {store.latency_note}" if store.latency_note else ""
        return Workload(
            store=store,
            requested_bytes=sum(small.sizes[:count]),
            files=count,
            source=small.source,
            mount=MountPlan(
                jobs,
                self.threads,
                f"{self.threads} threads take files from one queue: open, one read, close{late}",
            ),
            ceilings={
                "ceiling": CeilingPlan(
                    (gets,),
                    CEILING_CONCURRENCY,
                    f"AzureStorageClient, one GET per file (names and ETags known), "
                    f"{CEILING_CONCURRENCY} at once, into memory{late}",
                ),
                # what the -1r/-4r rows would get with no mount: their time per file beyond
                # these is the mount's own latency
                **{
                    f"ceiling-{n}r": CeilingPlan(
                        (gets,),
                        n,
                        f"diagnostic: the ceiling's GETs {n} at a time, as {n} reader"
                        f"{'s' if n > 1 else ''} with no mount would fetch them{late}",
                    )
                    for n in self.reader_rows
                },
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
        "order hinted 512 files ahead, hint settings default; blobmount-hints-2p: the same with "
        "DATASET_MOUNT_WORKER_PROCESSES=2"
    )
    threads = 4
    hinted_variants = {
        "blobmount-hints": (512, {}),
        "blobmount-hints-2p": (512, TWO_PROCESSES["blobmount-2p"]),
    }
    whole_file_rows = False
    reader_rows = ()
    mount_variants = {}


class SmallFilesHintedLatency(SmallFilesHinted):
    """Issue #11 where it matters: the same readers when every request takes as long as it does
    against Azure (Azurite on loopback answers in about a millisecond). A proxy delays every
    response by `LATENCY_MS` for every system alike, so a reader that waits for each file in turn
    is bound by its own parallelism, while the ceiling and hinted mount keep many requests in
    flight. Half the small files, so that the latency-bound readers do not lengthen the run."""

    name = "small-files-hinted-latency"
    title = (
        f"Many small files (~25 KB), read once by 4 threads, with and without read-order hints, "
        f"every response {LATENCY_MS:g} ms late"
    )
    settings_note = SmallFilesHinted.settings_note + (
        f"; a proxy delays every response by {LATENCY_MS:g} ms (a small GET's latency in an "
        "Azure region; Azurite here answers in about 1 ms)"
    )

    def workload(self, datasets: Datasets, profile: Profile) -> Workload:
        small = datasets.small()
        delayed = datasets.delayed(small.store, LATENCY_MS)
        return self.read_each_once(small, delayed, len(small.names) // 2)

    def systems(self, workload: Workload) -> list[System]:
        # rclone's full cache mode reads no faster than its cache-off mode once, and the
        # latency-bound runs are the long ones
        return [s for s in super().systems(workload) if s.name != "rclone-full"]


register(SmallFiles())
register(SmallFilesHinted())
register(SmallFilesHintedLatency())
