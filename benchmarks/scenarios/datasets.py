"""The run's datasets: generated once from `blobmount.testing.pattern`, uploaded once, shared.

A dataset is built the first time a scenario asks for it, so `--scenario small-files` never
generates the large file. Its bytes stay in memory for the whole run: they are what every read is
compared with.

Each dataset lives in its own Azurite: Azurite's metadata lookups scan every blob it holds, so its
CPU per request grows with the blob count (measured here: 1.3 ms per GET with 1,000 blobs, 3.2 ms
with 10,000, 7.8 ms with 20,000). One store per dataset keeps the large-file scenarios from paying
for the small files, and a future listing dataset from slowing everything else.

Uploads are plain Put Blob requests (one per blob, even for the 2 GiB file) with a container SAS
over kept-alive connections. One Put Blob per blob keeps Azurite's descriptor leak harmless (see
DESIGN.md), and skipping the SDK's request pipeline makes 20,000 small uploads several times
faster.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from blobmount.testing.pattern import pattern_bytes
from scenarios.delay_proxy import HOST as PROXY_HOST
from scenarios.delay_proxy import DelayProxy
from scenarios.plans import Profile

if TYPE_CHECKING:
    from blobmount.testing.azurite import AzuriteServer

log = logging.getLogger(__name__)

CONTAINER = "bench"
LARGE_BLOB = "large/large.bin"
#: folders of this many files, like an image dataset split into shards. The folders sit at the
#: root of the dataset's own container: Azurite answers a delimiter listing with maxresults=1
#: (the mount's start-up check) in time that grows with the square of the blobs under the first
#: folder (12 s for 4,000 under one folder, over 30 s for 10,000), so no folder may hold them all.
SMALL_FILES_PER_FOLDER = 1_000
SMALL_MIN_BYTES = 20_000
SMALL_MAX_BYTES = 30_000  # ~25 KB on average, as in the seed's small-file tests
#: one download part (the downloader's default part size) each
MEDIUM_FILE_BYTES = 8 * 1024 * 1024
UPLOAD_THREADS = 8
UPLOAD_TIMEOUT_S = 900.0


@dataclass(frozen=True, slots=True)
class Store:
    """Where a dataset lives: its own Azurite, one container; with `proxy`, reached through a
    delay proxy in front of that Azurite (`Datasets.delayed`)."""

    az: AzuriteServer
    container: str
    proxy: DelayProxy | None = None

    @property
    def account_url(self) -> str:
        """Where clients send requests: Azurite, or the proxy in front of it."""
        if self.proxy is None:
            return self.az.account_url
        return f"http://{PROXY_HOST}:{self.proxy.port}/{self.az.account}"

    @property
    def connection_string(self) -> str:
        from blobmount.testing.azurite import connection_string

        return connection_string(self.account_url)

    @property
    def uri(self) -> str:
        """The source URI a mount of the container is given."""
        return f"{self.account_url}/{self.container}"

    @property
    def latency_note(self) -> str:
        """How requests to this store are delayed, for descriptions ("" if they are not)."""
        if self.proxy is None:
            return ""
        return f"every response delayed {self.proxy.delay_ms:g} ms by a proxy"

    def backend_pids(self) -> dict[str, int]:
        """The processes that serve requests, by the name their CPU is reported under."""
        pids = {"azurite": self.az.pid}
        if self.proxy is not None:
            pids["proxy"] = self.proxy.pid
        return pids


@dataclass(frozen=True, slots=True)
class LargeFile:
    """One big blob; `data` is its content."""

    store: Store
    blob: str
    size: int
    etag: str
    data: bytes = field(repr=False)

    def source(self, blob: str) -> bytes:
        """The content of `blob` (this dataset has one)."""
        if blob != self.blob:
            raise KeyError(blob)
        return self.data


@dataclass(frozen=True, slots=True)
class ManyFiles:
    """Many blobs (the small files, the medium files); file i is
    `stream[offsets[i] : offsets[i] + sizes[i]]`."""

    store: Store
    names: tuple[str, ...]
    sizes: tuple[int, ...]
    offsets: tuple[int, ...]
    etags: tuple[str, ...]
    stream: bytes = field(repr=False)

    index: dict[str, int] = field(repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.index.update((name, i) for i, name in enumerate(self.names))

    @property
    def total_bytes(self) -> int:
        return len(self.stream)

    def source(self, blob: str) -> bytes:
        """The content of file `blob`."""
        i = self.index[blob]
        return self.stream[self.offsets[i] : self.offsets[i] + self.sizes[i]]


class Datasets:
    """Builds each dataset on first use, in an Azurite of its own, and keeps it for the run.

    `close()` stops every Azurite and delay proxy it started (also after a failure or an
    interrupt).
    """

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self._servers: list[AzuriteServer] = []
        self._large: LargeFile | None = None
        self._small: ManyFiles | None = None
        self._medium: ManyFiles | None = None
        self._proxies: dict[tuple[int, float], DelayProxy] = {}
        #: how each dataset was made (sizes, seconds), for the report
        self.built: list[dict[str, Any]] = []

    def _store(self, name: str) -> Store:
        from blobmount.testing.azurite import AzuriteServer

        az = AzuriteServer()
        self._servers.append(az)  # before start(): close() must stop it whatever happens
        az.start()
        log.info("Azurite for the %s dataset: pid %d, port %d", name, az.pid, az.port)
        az.create_container(CONTAINER)
        return Store(az, CONTAINER)

    def adopt(self, az: AzuriteServer) -> AzuriteServer:
        """Stop `az` (a dataset's Azurite a scenario made itself) with the others at close()."""
        self._servers.append(az)
        return az

    def delayed(self, store: Store, delay_ms: float) -> Store:
        """`store` reached through a delay proxy (started on first use, stopped at close())."""
        key = (store.az.port, delay_ms)
        proxy = self._proxies.get(key)
        if proxy is None:
            proxy = self._proxies[key] = DelayProxy(store.az.port, delay_ms)
            proxy.start()
            log.info(
                "delay proxy of %g ms: port %d -> Azurite's %d", delay_ms, proxy.port, store.az.port
            )
        return dataclasses.replace(store, proxy=proxy)

    @property
    def servers(self) -> list[AzuriteServer]:
        return list(self._servers)

    def run_only(self, active: AzuriteServer) -> None:
        """Let `active` run and pause (SIGSTOP) every other Azurite of this run until a scenario
        needs it again. An idle Azurite is not always idle: one holding gigabytes did minutes of
        background work (up to 0.8 core) during later scenarios, and on 2 cores that is CPU
        taken from the system being measured."""
        for az in self._servers:
            if az.running:
                os.kill(az.pid, signal.SIGCONT if az is active else signal.SIGSTOP)

    def close(self) -> None:
        """Stop every delay proxy and Azurite this run started (an Azurite is resumed first: a
        paused one cannot exit)."""
        for proxy in self._proxies.values():
            proxy.stop()
        for az in self._servers:
            if az.running:
                os.kill(az.pid, signal.SIGCONT)
            az.stop()

    def large(self) -> LargeFile:
        """The large file (2 GiB full, 512 MiB quick), one Put Blob."""
        if self._large is None:
            size = self.profile.large_file_bytes
            log.info("generating the large file (%d MiB)", size >> 20)
            started = time.perf_counter()
            data = pattern_bytes("blobmount-bench-large", 0, size)
            generated = time.perf_counter()
            store = self._store("large")
            log.info("uploading %s", LARGE_BLOB)
            started_upload = time.perf_counter()
            (etag,) = store.az.put_many(CONTAINER, [(LARGE_BLOB, data)], 1, UPLOAD_TIMEOUT_S)
            uploaded = time.perf_counter()
            self._large = LargeFile(store, LARGE_BLOB, size, etag, data)
            self.built.append(
                {
                    "dataset": "large",
                    "blobs": 1,
                    "bytes": size,
                    "generate_s": round(generated - started, 2),
                    "upload_s": round(uploaded - started_upload, 2),
                }
            )
        return self._large

    def small(self) -> ManyFiles:
        """The small files (~25 KB each; 10,000 full, 4,000 quick) in folders of 1,000 at the
        root of their container."""
        if self._small is None:
            count = self.profile.small_file_count
            rng = random.Random(f"blobmount-bench-small-sizes-{count}")
            sizes = [rng.randint(SMALL_MIN_BYTES, SMALL_MAX_BYTES) for _ in range(count)]
            names = [f"d{i // SMALL_FILES_PER_FOLDER:03d}/f{i:06d}.bin" for i in range(count)]
            self._small = self._many("small", names, sizes)
        return self._small

    def medium(self) -> ManyFiles:
        """The medium files (8 MiB each; 128 full, 32 quick) in one folder."""
        if self._medium is None:
            count = self.profile.medium_file_count
            names = [f"medium/m{i:04d}.bin" for i in range(count)]
            self._medium = self._many("medium", names, [MEDIUM_FILE_BYTES] * count)
        return self._medium

    def _many(self, dataset: str, names: list[str], sizes: list[int]) -> ManyFiles:
        """Generate files of these names and sizes and upload them to a store of their own."""
        offsets, total = [], 0
        for size in sizes:
            offsets.append(total)
            total += size
        log.info("generating %d %s files (%d MB)", len(names), dataset, total // 1_000_000)
        started = time.perf_counter()
        stream = pattern_bytes(f"blobmount-bench-{dataset}", 0, total)
        view = memoryview(stream)
        items = [
            (name, bytes(view[off : off + size]))
            for name, off, size in zip(names, offsets, sizes, strict=True)
        ]
        generated = time.perf_counter()
        store = self._store(dataset)
        log.info("uploading %d %s files", len(names), dataset)
        started_upload = time.perf_counter()
        etags = store.az.put_many(CONTAINER, items, UPLOAD_THREADS, UPLOAD_TIMEOUT_S)
        uploaded = time.perf_counter()
        del items
        log.info("uploaded in %.1f s", uploaded - started_upload)
        self.built.append(
            {
                "dataset": dataset,
                "blobs": len(names),
                "bytes": total,
                "generate_s": round(generated - started, 2),
                "upload_s": round(uploaded - started_upload, 2),
            }
        )
        return ManyFiles(store, tuple(names), tuple(sizes), tuple(offsets), tuple(etags), stream)
