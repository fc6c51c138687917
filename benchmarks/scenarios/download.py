"""Scenario 7: download mode, one large file and many medium files copied to local disk.

The seed's download table ("1 x 100GB File", "100 x 1GB Files"; download only, and download
with MD5), scaled down: the large file of scenarios 1, 2 and 5 (2 GiB; quick 512 MiB) and 128
medium files of 8 MiB (quick 32), each dataset the whole container of its own Azurite. Two
scenarios, so each gets its own row and ratio.

Systems: the ceiling (the same GETs the downloader makes, parts of 8 MiB, as many at once as it
has transfers, into memory, no listing: one list request of a few ms), `download`,
`download-verify` (`--verify`: MD5 of every file against its Content-MD5, the seed's second
column), and three diagnostics: `download-page-cache` (`--page-cache`: every write through the
page cache, the O_DIRECT trade-off of docs/DOWNLOAD.md), `download-16MiB` (`--part-size 16MB`,
the part-size trade-off docs/DOWNLOAD.md describes; only where files have several parts) and
`download-local` (the local side alone). No mount runs here.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence

from scenarios import register
from scenarios.base import Scenario, System, Workload
from scenarios.ceiling import CeilingSystem
from scenarios.datasets import Datasets, Store
from scenarios.download_systems import TRANSFERS, DownloadSystem, LocalDownloadSystem
from scenarios.plans import CeilingPlan, FileJob, MountPlan, Profile, RangeGet, Read, chunked

#: a dataset's store, its (blob, ETag, size), and its content by blob
FileSet = tuple[Store, Sequence[tuple[str, str, int]], Callable[[str], bytes]]
#: the downloader's default part size
PART_SIZE = 8 * 1024 * 1024
#: threads reading the downloaded files back for verification (untimed)
VERIFY_THREADS = 8


class Download(Scenario):
    number = 7
    settings_note = (
        f"RSLEX_DOWNLOADER_THREADS default ({TRANSFERS}: 4 x cores), parts of 8 MiB; the "
        "container holds only this dataset"
    )

    @abstractmethod
    def files(self, datasets: Datasets) -> FileSet:
        """The files to download."""

    def workload(self, datasets: Datasets, profile: Profile) -> Workload:
        store, files, source = self.files(datasets)
        jobs: list[FileJob] = []
        gets: list[RangeGet] = []
        dest = 0
        for blob, etag, size in files:
            parts = chunked(0, size, PART_SIZE)
            jobs.append(FileJob(blob, tuple(Read(o, n, dest + o) for o, n in parts)))
            gets.extend(RangeGet(blob, etag, o, n, dest + o) for o, n in parts)
            dest += size
        return Workload(
            store=store,
            requested_bytes=dest,
            files=len(files),
            source=source,
            # not timed: what the downloaded folder is read back and checked with
            mount=MountPlan(tuple(jobs), VERIFY_THREADS, "every downloaded file read back"),
            ceilings={
                "ceiling": CeilingPlan(
                    (tuple(gets),),
                    TRANSFERS,
                    f"AzureStorageClient, the downloader's GETs (parts of 8 MiB), {TRANSFERS} "
                    "at once, into memory",
                )
            },
        )

    def systems(self, workload: Workload) -> list[System]:
        systems: list[System] = [
            CeilingSystem("ceiling"),
            DownloadSystem("download"),
            DownloadSystem("download-verify", ("--verify",)),
            DownloadSystem(
                "download-page-cache",
                ("--page-cache",),
                "every write through the page cache, as before O_DIRECT writes",
            ),
        ]
        if workload.requested_bytes > PART_SIZE * workload.files:  # files of several parts
            systems.append(
                DownloadSystem("download-16MiB", ("--part-size", "16MB"), "twice the part size")
            )
        return [*systems, LocalDownloadSystem()]


class DownloadLarge(Download):
    name = "download-large"
    title = "Download mode: one large file copied to local disk"

    def files(self, datasets: Datasets) -> FileSet:
        large = datasets.large()
        return large.store, [(large.blob, large.etag, large.size)], large.source


class DownloadMedium(Download):
    name = "download-medium"
    title = "Download mode: many medium files (8 MiB) copied to local disk"

    def files(self, datasets: Datasets) -> FileSet:
        medium = datasets.medium()
        return (
            medium.store,
            list(zip(medium.names, medium.etags, medium.sizes, strict=True)),
            medium.source,
        )


register(DownloadLarge())
register(DownloadMedium())
