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
`blobmount.testing.azurite_seed` (uploading 100,000 blobs to Azurite takes most of an hour; its
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

import contextlib
import logging
import os
import tempfile
import threading
import time
import weakref
from abc import abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scenarios import register
from scenarios.base import MountPlan, Profile, Scenario, Workload
from scenarios.datasets import Datasets, Store
from scenarios.systems import (
    Bench,
    BlobmountSystem,
    ResourceMeter,
    RunMetrics,
    System,
    _storage_delta,
    proc_status_kib,
    timeout_for,
)

log = logging.getLogger(__name__)

PAGE = 5_000
#: one list page of names ahead of each dataset's big folder (see the module's docstring)
AHEAD = [("a.txt", b"ahead of the big folder\n")] + [
    (f"a/f{i:04d}", b"ahead\n") for i in range(PAGE - 1)
]


@dataclass(frozen=True)
class ListingData:
    """A seeded container and what a listing of its `folder` must give."""

    store: Store
    folder: str  # relative to the mount root and the container, no trailing '/'
    #: the files below `folder`, relative to it, in name order
    names: tuple[str, ...] = field(repr=False)

    @property
    def prefix(self) -> str:
        return self.folder + "/"


_built: weakref.WeakKeyDictionary[Datasets, dict[str, ListingData]] = weakref.WeakKeyDictionary()


def seeded(datasets: Datasets, key: str, folder: str, names: list[str]) -> ListingData:
    """The dataset `key` (built on first use, in an Azurite of its own that `datasets` stops):
    `folder`/name for each of `names`, a few bytes each, after the AHEAD blobs."""
    from blobmount.testing.azurite_seed import SeededAzurite

    cache = _built.setdefault(datasets, {})
    if key not in cache:
        started = time.perf_counter()
        blobs = [*AHEAD, *((f"{folder}/{n}", f"{n}\n".encode()) for n in names)]
        generated = time.perf_counter()
        log.info("seeding %d blobs for the %s dataset", len(blobs), key)
        az = datasets.adopt(SeededAzurite({key: blobs}))
        az.start()
        assert az.seeded is not None
        cache[key] = ListingData(Store(az, key), folder, tuple(names))
        datasets.built.append(
            {
                "dataset": key,
                "blobs": len(blobs),
                "bytes": az.seeded.bytes,
                "generate_s": round(generated - started, 2),
                "upload_s": round(az.seeded.seconds, 2),
                "how": f"seeded into Azurite's database in {az.seeded.seconds:.1f} s "
                "(blobmount.testing.azurite_seed), some read back",
            }
        )
    return cache[key]


class Milestones:
    """Seconds from start() to the first entry, to the `at`-th, and to each add()."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.count = 0
        self.marks: dict[str, float] = {}
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def add(self, n: int = 1) -> None:
        before, self.count = self.count, self.count + n
        now = time.perf_counter() - self._t0
        if before == 0 and n:
            self.marks["first"] = now
        if before < self.at <= self.count:
            self.marks[f"{self.at:,}th"] = now


def _check(got: list[str], data: ListingData) -> str | None:
    """None if a listing gave exactly the dataset's names, else what was wrong."""
    if sorted(got) == list(data.names):
        return None
    missing = len(set(data.names) - set(got))
    return f"{len(got):,} names listed, {missing:,} of the expected missing"


# -- systems -----------------------------------------------------------------------------------


class DirectListing(System):
    """A listing without FUSE, timed from `start()` to its last page. Subclasses `list()`."""

    def __init__(self, name: str, data: ListingData, milestone: int, description: str) -> None:
        self.name = name
        self.kind = "ceiling" if name == "ceiling" else "diagnostic"
        self.data = data
        self.milestone = milestone
        self.description = description

    @abstractmethod
    def list(
        self, start: Callable[[], None], page: Callable[[list[str]], None], timeout_s: float
    ) -> None:
        """Get ready (client, connection), call start(), then page(names) for each page."""

    def run_once(self, bench: Bench, scenario: Scenario, workload: Workload) -> RunMetrics:
        meter = ResourceMeter(
            {"harness": os.getpid(), "azurite": self.data.store.az.pid}, bench.prepare_memory
        )
        marks = Milestones(self.milestone)
        names: list[str] = []
        pages = 0

        def start() -> None:
            meter.start()
            marks.start()

        def page(got: list[str]) -> None:
            nonlocal pages
            pages += 1
            names.extend(got)
            marks.add(len(got))

        self.list(start, page, timeout_for(workload, bench))
        seconds = meter.stop()["wall_s"]
        return _metrics(seconds, meter, names, self.data, {"list_requests": pages}, marks)


class ClientListing(DirectListing):
    """`AzureStorageClient.list_page` (the mount's client) on trio, page after page."""

    def __init__(
        self, name: str, data: ListingData, delimiter: str | None, milestone: int, what: str
    ) -> None:
        super().__init__(name, data, milestone, what)
        self.delimiter = delimiter

    def list(
        self, start: Callable[[], None], page: Callable[[list[str]], None], timeout_s: float
    ) -> None:
        import trio

        from blobmount.storage.azure import AzureStorageClient

        az, prefix = self.data.store.az, self.data.prefix

        async def main() -> None:
            client = AzureStorageClient(az.account_url, self.data.store.container, az.credential())
            try:
                # the client and a connection exist before the clock starts, as for the mount
                await client.list_page(prefix, delimiter=self.delimiter, max_results=1)
                start()
                continuation = None
                with trio.fail_after(timeout_s):
                    while True:
                        got = await client.list_page(
                            prefix, delimiter=self.delimiter, continuation=continuation
                        )
                        page([b.name[len(prefix) :] for b in got.blobs])
                        if (continuation := got.continuation) is None:
                            return
            finally:
                with trio.CancelScope(shield=True):
                    await client.aclose()

        trio.run(main)


class SdkListing(DirectListing):
    """The Azure SDK's own listing of the prefix: `ContainerClient.list_blobs(...).by_page()`."""

    def __init__(self, data: ListingData, milestone: int) -> None:
        super().__init__(
            "sdk-list_blobs",
            data,
            milestone,
            "diagnostic: the Azure SDK's ContainerClient.list_blobs(name_starts_with=prefix, "
            f"results_per_page={PAGE:,}).by_page(), synchronous, no FUSE",
        )

    def list(
        self, start: Callable[[], None], page: Callable[[list[str]], None], timeout_s: float
    ) -> None:
        from azure.storage.blob import ContainerClient

        az, prefix = self.data.store.az, self.data.prefix
        with ContainerClient.from_connection_string(
            az.connection_string, self.data.store.container, connection_timeout=timeout_s
        ) as client:
            client.get_container_properties()  # a connection exists before the clock starts
            start()
            listing = client.list_blobs(name_starts_with=prefix, results_per_page=PAGE)
            for got in listing.by_page():
                page([blob.name[len(prefix) :] for blob in got])


def scandir_names(folder: Path, marks: Milestones) -> list[str]:
    """os.scandir of one folder: its entries' names."""
    names = []
    with os.scandir(folder) as entries:
        for entry in entries:
            names.append(entry.name)
            marks.add()
    return names


def walk_names(folder: Path, marks: Milestones) -> list[str]:
    """os.walk of a tree: every file's path relative to `folder`."""
    names = []
    for parent, _, files in os.walk(folder):
        rel = os.path.relpath(parent, folder)
        names.extend(f"{rel}/{f}" if rel != "." else f for f in files)
        marks.add(len(files))
    return names


class MountListing(BlobmountSystem):
    """A fresh `blobmount mount` of the dataset's container; the folder listed through it."""

    def __init__(
        self,
        data: ListingData,
        lister: Callable[[Path, Milestones], list[str]],
        milestone: int,
        name: str = "blobmount",
        extra_env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(name, extra_env)
        self.data = data
        self.lister = lister
        self.milestone = milestone

    def run_once(self, bench: Bench, scenario: Scenario, workload: Workload) -> RunMetrics:
        work = Path(tempfile.mkdtemp(prefix="bmbench-"))
        run_no = len(list(bench.out_dir.glob(f"logs/{scenario.name}-{self.name}-*.log")))
        daemon = self.daemon(self.data.store, scenario, work)
        daemon.ready_check = os.stat  # an os.listdir of the root would list before the clock
        daemon.log_copy = bench.out_dir / "logs" / f"{scenario.name}-{self.name}-{run_no}.log"
        marks = Milestones(self.milestone)
        with daemon:
            before = self.stats(daemon)
            meter = ResourceMeter(
                {"harness": os.getpid(), "azurite": self.data.store.az.pid, "daemon": daemon.pid},
                bench.prepare_memory,
            )
            meter.start()
            marks.start()
            started = time.perf_counter()
            with _deadline(timeout_for(workload, bench), daemon.abort):
                names = self.lister(daemon.mountpoint / self.data.folder, marks)
            seconds = time.perf_counter() - started
            meter.stop()
            after = self.stats(daemon)
            hwm = proc_status_kib(daemon.pid, "VmHWM")
        metrics = _metrics(seconds, meter, names, self.data, _storage_delta(before, after), marks)
        metrics.peak_rss_bytes = None if hwm is None else hwm * 1024
        metrics.mount_s = daemon.mount_s
        metrics.stats_after = after
        return metrics


@contextlib.contextmanager
def _deadline(timeout_s: float, on_expiry: Callable[[], None]) -> Iterator[None]:
    """Call `on_expiry` (abort the mount, which fails the listing) if the with-block still runs
    after `timeout_s`; the block then raises TimeoutError."""
    done, expired = threading.Event(), threading.Event()

    def watchdog() -> None:
        if not done.wait(timeout_s):
            expired.set()
            on_expiry()

    threading.Thread(target=watchdog, name="listing-watchdog", daemon=True).start()
    try:
        yield
    except Exception as exc:
        if expired.is_set():
            raise TimeoutError(f"the listing took over {timeout_s:.0f} s") from exc
        raise
    finally:
        done.set()
    if expired.is_set():
        raise TimeoutError(f"the listing took over {timeout_s:.0f} s")


def _metrics(
    seconds: float,
    meter: ResourceMeter,
    names: list[str],
    data: ListingData,
    storage: dict[str, Any],
    marks: Milestones,
) -> RunMetrics:
    usage = meter.usage
    mismatch = _check(names, data)
    return RunMetrics(
        seconds=seconds,
        verified=mismatch is None,
        client_cpu_s=usage.get("daemon", usage.get("harness")),
        harness_cpu_s=usage.get("harness"),
        azurite_cpu_s=usage.get("azurite"),
        others_cpu_s=usage.get("others"),
        storage={k: v for k, v in storage.items() if k == "list_requests"},
        mismatch_at=mismatch,
        listing=marks.marks,
    )


# -- scenarios ---------------------------------------------------------------------------------


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
