"""Scenario 6: listing. A huge flat folder, and a walk of a tree of small folders, each listed
through a fresh mount and directly with the mount's own storage client.

- `listing` (issue #9's scenario 6, issue #8's benchmark): one folder of 100,000 blobs (quick:
  20,000) listed once per system; reported: the seconds to the first entry, to the 50,000th
  (quick: 10,000th) and to the last, and the list requests.
  - `ceiling`: `AzureStorageClient.list_page` of the folder with delimiter '/', page after page
    (the requests the mount's hierarchical listing makes, without FUSE);
  - `sdk-list_blobs` (diagnostic): the Azure SDK's own `ContainerClient.list_blobs(...)
    .by_page()` of the same prefix;
  - `blobmount`: `os.scandir` of the folder through a fresh mount (default listing mode, auto:
    one folder is listed on its own); `blobmount-flat` (diagnostic): the same with
    DATASET_MOUNT_LISTING_MODE=flat.
- `tree-walk`: `os.walk` of 50,000 blobs in 5,000 folders (quick: 10,000 in 1,000).
  - `ceiling`: a flat listing (no delimiter) of the whole prefix with `AzureStorageClient`:
    every name with the fewest requests;
  - `blobmount` (auto), `blobmount-flat` and `blobmount-hierarchical` (one request per folder,
    what a mount without whole-tree listing costs).

Datasets are written straight into an on-disk Azurite of their own by
`tests/helpers/azurite_seed.py` (uploading 100,000 blobs to Azurite takes most of an hour; its
inserts are O(n)). Each container also holds, ahead of the big folder in name order, `a.txt` and
a folder `a/` (one list page of names together):
- Azurite answers a one-item delimiter listing of a folder above N blobs (the mount's start-up
  check) by reading them one at a time, O(N^2), unless a blob comes first; Azure does not.
- The daemon reads the first entry of its root when it mounts. In flat mode that starts the
  walk of the whole container; with one page of other names first, the big folder's names are
  still to be listed when the clock starts, as in the default mode. (The harness checks these
  mounts with os.stat rather than os.listdir, which in flat mode would walk everything.)
"""

from __future__ import annotations

from scenarios import register
from scenarios.base import Scenario, System, Workload
from scenarios.datasets import Datasets
from scenarios.listing_systems import (
    PAGE,
    ClientListing,
    ListingData,
    MountListing,
    SdkListing,
    scandir_names,
    seeded,
    walk_names,
)
from scenarios.plans import MountPlan, Profile


def _workload(data: ListingData, description: str) -> Workload:
    return Workload(
        store=data.store,
        requested_bytes=0,
        files=len(data.names),
        source=lambda blob: b"",
        mount=MountPlan((), 1, description),
        ceilings={},
    )


class Listing(Scenario):
    name = "listing"
    number = 6
    title = "Listing a huge flat folder (os.scandir): first entry, 50,000th, all"
    settings_note = "defaults (listing mode auto); diagnostic: DATASET_MOUNT_LISTING_MODE=flat"

    def __init__(self) -> None:
        self.data: ListingData | None = None
        self.milestone = 0

    def workload(self, datasets: Datasets, profile: Profile) -> Workload:
        count = 20_000 if profile.name.startswith("quick") else 100_000
        self.milestone = min(50_000, count // 2)
        names = [f"img_{i:07d}.jpg" for i in range(count)]
        self.data = seeded(datasets, f"listing-{count}", "flat", names)
        return _workload(self.data, f"os.scandir of one folder of {count:,} blobs")

    def systems(self, workload: Workload) -> list[System]:
        assert self.data is not None
        data, at = self.data, self.milestone
        return [
            ClientListing(
                "ceiling",
                data,
                "/",
                at,
                f"AzureStorageClient.list_page of the folder, delimiter '/', pages of {PAGE:,} "
                "one after another (the mount's requests, without FUSE)",
            ),
            SdkListing(data, at),
            MountListing(data, scandir_names, at),
            MountListing(
                data, scandir_names, at, "blobmount-flat", {"DATASET_MOUNT_LISTING_MODE": "flat"}
            ),
        ]


class TreeWalk(Scenario):
    name = "tree-walk"
    number = 6
    title = "os.walk of a tree of small folders (10 files each)"
    settings_note = "defaults (listing mode auto); diagnostics: flat and hierarchical modes"

    def __init__(self) -> None:
        self.data: ListingData | None = None

    def workload(self, datasets: Datasets, profile: Profile) -> Workload:
        folders = 1_000 if profile.name.startswith("quick") else 5_000
        names = [f"d{d:05d}/f{f:02d}.jpg" for d in range(folders) for f in range(10)]
        self.data = seeded(datasets, f"tree-{folders}", "tree", names)
        return _workload(self.data, f"os.walk of {len(names):,} files in {folders:,} folders")

    def systems(self, workload: Workload) -> list[System]:
        assert self.data is not None
        data, at = self.data, len(self.data.names) // 2
        return [
            ClientListing(
                "ceiling",
                data,
                None,
                at,
                f"AzureStorageClient.list_page of the whole prefix, no delimiter, pages of "
                f"{PAGE:,} one after another: every name with the fewest requests",
            ),
            MountListing(data, walk_names, at),
            *(
                MountListing(data, walk_names, at, f"blobmount-{mode}", {_MODE: mode})
                for mode in ("flat", "hierarchical")
            ),
        ]


_MODE = "DATASET_MOUNT_LISTING_MODE"

register(Listing())
register(TreeWalk())
