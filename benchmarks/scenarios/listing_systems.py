"""The listing scenarios' datasets and systems (scenarios/listing.py says what each measures).

A dataset is seeded straight into an on-disk Azurite of its own (`seeded`). Every system times a
listing from its start to its last name, with milestones (the first entry, the N-th), and checks
it found exactly the dataset's names: directly with a client (`ClientListing`, `SdkListing`), or
through a fresh mount (`MountListing`).
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

from scenarios.base import Bench, Scenario, System, Workload, timeout_for
from scenarios.blobmount_system import BlobmountSystem
from scenarios.datasets import Datasets, Store
from scenarios.measure import ResourceMeter, proc_status_kib
from scenarios.results import RunMetrics, storage_delta

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
    from tests.helpers.azurite_seed import SeededAzurite

    cache = _built.setdefault(datasets, {})
    if key not in cache:
        started = time.perf_counter()
        blobs = [*AHEAD, *((f"{folder}/{n}", f"{n}\n".encode()) for n in names)]
        generated = time.perf_counter()
        log.info("seeding %d blobs for the %s dataset", len(blobs), key)
        az = SeededAzurite({key: blobs})
        datasets.adopt(az)
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
                "(tests/helpers/azurite_seed.py), some read back",
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
    names: list[str] = []
    with os.scandir(folder) as entries:
        for entry in entries:
            names.append(entry.name)
            marks.add()
    return names


def walk_names(folder: Path, marks: Milestones) -> list[str]:
    """os.walk of a tree: every file's path relative to `folder`."""
    names: list[str] = []
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
        metrics = _metrics(seconds, meter, names, self.data, storage_delta(before, after), marks)
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
