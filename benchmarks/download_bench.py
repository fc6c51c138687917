"""Download mode against the backend ceiling: the seed's download table, on a private Azurite.

    python benchmarks/download_bench.py [--quick] [--repeat N] [--json FILE]

Datasets (the seed's "1 x 100GB" and "100 x 1GB" rows, scaled to one machine):

    one-large    1 x 512 MiB        (quick: 1 x 64 MiB)
    many-medium  64 x 8 MiB         (quick: 16 x 4 MiB)
    many-small   2000 x 16 KiB      (quick: 300 x 16 KiB)   the per-file overhead

For each, the same storage stack the command builds (`daemon.open_azure_storage` + retries):

- ceiling: list the prefix, then the same ranged GETs the downloader makes (parts of 8 MiB,
  RSLEX_DOWNLOADER_THREADS at once) into memory, discarded;
- download: `Downloader` into a fresh folder, timed to the end of its final checkpoint (the
  syncfs that makes the manifest true, so the disk flush is *in* the time);
- local: the same download from an `InMemoryStorageClient` holding the same bytes, i.e. the
  local side alone (temp files, pwrite, rename, syncfs, manifest) with no network; on a small
  machine where Azurite shares the CPUs, download ~ ceiling + local shows the two do not
  overlap for want of cores, not for want of concurrency;
- every case runs once per round, `repeat` rounds (median reported), after two warm-up passes
  over every dataset: Azurite gets faster over its first passes and drifts, and rounds spread
  the drift over all cases instead of favouring the ones measured last;
- variants (not in --quick): file writes inline on the trio thread instead of `to_thread`, and
  other part sizes for the large file.

Every downloaded file is checked against the source after the clock stops. `run()` is the entry
point for benchmarks/run.py; `__main__` starts its own Azurite (blobmount.testing.azurite).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from blobmount.daemon import open_azure_storage
from blobmount.download.downloader import DownloadConfig, Downloader
from blobmount.download.transfer import DEFAULT_PART_SIZE
from blobmount.settings import load_settings
from blobmount.source import parse_source
from blobmount.storage.base import BlobProps, StorageClient
from blobmount.storage.memory import InMemoryStorageClient
from blobmount.storage.retry import RetryingStorageClient
from blobmount.testing.azurite import AzuriteServer
from blobmount.testing.pattern import pattern_bytes

log = logging.getLogger("bench.download")

MiB = 1024 * 1024
KiB = 1024

#: name -> (files, size of each) per mode
DATASETS: dict[str, dict[bool, tuple[int, int]]] = {
    "one-large": {False: (1, 512 * MiB), True: (1, 64 * MiB)},
    "many-medium": {False: (64, 8 * MiB), True: (16, 4 * MiB)},
    "many-small": {False: (2000, 16 * KiB), True: (300, 16 * KiB)},
}
PART_SIZES = (4 * MiB, 16 * MiB, 32 * MiB)


def blob_names(dataset: str, quick: bool) -> list[tuple[str, int]]:
    count, size = DATASETS[dataset][quick]
    return [(f"{dataset}/f{i:04d}.bin", size) for i in range(count)]


def upload(az: AzuriteServer, container: str, quick: bool) -> None:
    """Upload every dataset; each blob is one Put Blob of deterministic bytes."""
    for dataset in DATASETS:
        names = blob_names(dataset, quick)
        log.info("uploading %s: %d x %d KiB", dataset, len(names), names[0][1] // KiB)
        az.upload_many(
            container, ((name, pattern_bytes(name, 0, size)) for name, size in names), threads=8
        )


# -- one measurement -------------------------------------------------------------------------


async def _list(storage: StorageClient, prefix: str) -> list[BlobProps]:
    blobs: list[BlobProps] = []
    token: str | None = None
    while True:
        page = await storage.list_page(prefix, delimiter=None, continuation=token)
        blobs.extend(page.blobs)
        token = page.continuation
        if token is None:
            return blobs


async def ceiling(storage: StorageClient, prefix: str, transfers: int, part_size: int) -> float:
    """Seconds to list `prefix` and GET every blob into memory, in the downloader's parts,
    `transfers` at once."""
    started = time.perf_counter()
    blobs = await _list(storage, prefix)
    limiter = trio.CapacityLimiter(transfers)
    received = 0

    async def get(blob: BlobProps, start: int, length: int) -> None:
        nonlocal received
        async with limiter:
            data = await storage.get_range(blob.name, blob.etag, start, length)
            received += len(data)

    async with trio.open_nursery() as nursery:
        for blob in blobs:
            for start in range(0, blob.size, part_size):
                nursery.start_soon(get, blob, start, min(part_size, blob.size - start))
    assert received == sum(b.size for b in blobs)
    return time.perf_counter() - started


async def download(
    storage: StorageClient, prefix: str, dest: Path, transfers: int, part_size: int, inline: bool
) -> tuple[float, dict[str, Any]]:
    config = DownloadConfig(
        dest=dest,
        prefix=prefix,
        transfers=transfers,
        part_size=part_size,
        write_in_thread=not inline,
    )
    started = time.perf_counter()
    result = await Downloader(storage, config).run()
    seconds = time.perf_counter() - started
    if not result.ok:
        raise RuntimeError(f"download failed: {result.fatal or result.failures[:3]}")
    return seconds, {"checkpoint_s": result.stats.checkpoint_s}


def verify(dest: Path, dataset: str, quick: bool) -> None:
    for name, size in blob_names(dataset, quick):
        local = dest / name.removeprefix(dataset + "/")
        want = hashlib.sha256(pattern_bytes(name, 0, size)).digest()
        if hashlib.sha256(local.read_bytes()).digest() != want:
            raise AssertionError(f"{local} does not match the blob")


@dataclass(frozen=True, slots=True)
class Case:
    table: str  # "datasets" (the main table) or "variants"
    name: str
    dataset: str
    part_size: int
    inline: bool  # file writes on the trio thread instead of to_thread
    with_ceiling: bool


def _median(values: list[float]) -> float:
    return statistics.median(values)


# -- the benchmark ---------------------------------------------------------------------------


def run(
    azurite_account_url: str, connection_string: str, container: str, quick: bool
) -> dict[str, Any]:
    """Measure every dataset (uploaded by `upload`) against the ceiling. Returns the figures."""
    repeat = int(os.environ.get("BENCH_REPEAT", "2" if quick else "3"))
    os.environ["AZURE_STORAGE_CONNECTION_STRING"] = connection_string
    settings = load_settings()
    spec = parse_source(f"{azurite_account_url}/{container}")
    transfers = settings.downloader_threads
    work = Path(tempfile.mkdtemp(prefix="blobmount-download-bench-"))
    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "transfers": transfers,
        "part_size": DEFAULT_PART_SIZE,
        "repeat": repeat,
        "quick": quick,
        "datasets": {},
        "variants": {},
    }

    cases = [Case("datasets", d, d, DEFAULT_PART_SIZE, False, True) for d in DATASETS]
    if not quick:
        cases += [
            Case("variants", f"{d}, inline writes", d, DEFAULT_PART_SIZE, True, False)
            for d in DATASETS
        ]
        cases += [
            Case("variants", f"one-large, parts of {p // MiB} MiB", "one-large", p, False, True)
            for p in PART_SIZES
        ]
    samples: dict[str, dict[str, list[float]]] = {c.name: {} for c in cases}

    def add(case: Case, key: str, value: float) -> None:
        samples[case.name].setdefault(key, []).append(value)

    async def main() -> None:
        async with open_azure_storage(settings, spec) as azure:
            storage = RetryingStorageClient(azure, retries=settings.http_retry_count)
            # warm Azurite's JIT and the connection pool with the request shapes used below:
            # its first passes over a dataset are up to 2x slower than later ones
            for _ in range(2):
                for dataset in DATASETS:
                    await ceiling(storage, dataset + "/", transfers, DEFAULT_PART_SIZE)
            # rounds: every case once per round, so Azurite's drift spreads over all of them
            for round_ in range(repeat):
                for case in cases:
                    await measure_once(storage, case)
                log.info("round %d of %d done", round_ + 1, repeat)

    async def measure_once(storage: StorageClient, case: Case) -> None:
        prefix = case.dataset + "/"
        if case.with_ceiling:
            add(case, "ceiling", await ceiling(storage, prefix, transfers, case.part_size))
        dest = work / "dest"
        seconds, extra = await download(
            storage, prefix, dest, transfers, case.part_size, case.inline
        )
        add(case, "download", seconds)
        add(case, "checkpoint", extra["checkpoint_s"])
        await trio.to_thread.run_sync(verify, dest, case.dataset, quick)
        await trio.to_thread.run_sync(shutil.rmtree, dest)
        # the local side alone: the same download from memory, no network
        memory = InMemoryStorageClient()
        for name, size in blob_names(case.dataset, quick):
            memory.put(name, pattern_bytes(name, 0, size), md5=False)
        seconds, _ = await download(memory, prefix, dest, transfers, case.part_size, case.inline)
        add(case, "local", seconds)
        await trio.to_thread.run_sync(shutil.rmtree, dest)

    try:
        trio.run(main)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for case in cases:
        count, size = DATASETS[case.dataset][quick]
        total = count * size
        got = samples[case.name]
        row: dict[str, Any] = {
            "files": count,
            "bytes": total,
            "part_size": case.part_size,
            "writes": "inline" if case.inline else "to_thread",
            "download_s": _median(got["download"]),
            "download_MBps": total / 1e6 / _median(got["download"]),
            "download_files_per_s": count / _median(got["download"]),
            "checkpoint_s": _median(got["checkpoint"]),
            "local_s": _median(got["local"]),
            "local_MBps": total / 1e6 / _median(got["local"]),
            "runs_s": got["download"],
        }
        if "ceiling" in got:
            row["ceiling_s"] = _median(got["ceiling"])
            row["ceiling_MBps"] = total / 1e6 / row["ceiling_s"]
            row["ratio"] = row["ceiling_s"] / row["download_s"]
            row["ceiling_runs_s"] = got["ceiling"]
        report[case.table][case.name] = row
        log.info("%s: %s", case.name, _line(row))
    return report


def _line(row: dict[str, Any]) -> str:
    text = (
        f"{row['files']} x {row['bytes'] // row['files'] // KiB} KiB: download "
        f"{row['download_s']:.2f} s ({row['download_MBps']:.0f} MB/s, "
        f"{row['download_files_per_s']:.0f} files/s, of which syncfs+manifest "
        f"{row['checkpoint_s']:.2f} s); local side alone {row['local_s']:.2f} s"
    )
    if "ceiling_s" in row:
        text += (
            f"; ceiling {row['ceiling_s']:.2f} s ({row['ceiling_MBps']:.0f} MB/s); "
            f"download/ceiling throughput {row['ratio']:.2f}"
        )
    return text


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"download benchmark ({'quick' if report['quick'] else 'full'}, "
        f"{report['transfers']} transfers, parts of {report['part_size'] // MiB} MiB, "
        f"median of {report['repeat']}; {report['machine']['cpus']} CPUs)",
        "",
        "| dataset | download (of which syncfs + manifest) | ceiling (GETs into memory) "
        "| download / ceiling | local side alone (from memory) |",
        "|---|---|---|---|---|",
    ]
    for name, row in report["datasets"].items():
        lines.append(
            f"| {name}: {row['files']} x {_size(row['bytes'] // row['files'])} | "
            f"{row['download_s']:.2f} s, {row['download_MBps']:.0f} MB/s "
            f"({row['checkpoint_s']:.2f} s) | "
            f"{row['ceiling_s']:.2f} s, {row['ceiling_MBps']:.0f} MB/s | {row['ratio']:.2f} | "
            f"{row['local_s']:.2f} s, {row['local_MBps']:.0f} MB/s |"
        )
    if report["variants"]:
        lines += [
            "",
            "| variant | download (of which syncfs + manifest) | ceiling | ratio | local side |",
            "|---|---|---|---|---|",
        ]
        for name, row in report["variants"].items():
            ceiling_text = (
                f"{row['ceiling_s']:.2f} s, {row['ceiling_MBps']:.0f} MB/s"
                if "ceiling_s" in row
                else "-"
            )
            ratio = f"{row['ratio']:.2f}" if "ratio" in row else "-"
            lines.append(
                f"| {name} | {row['download_s']:.2f} s, {row['download_MBps']:.0f} MB/s "
                f"({row['checkpoint_s']:.2f} s) | {ceiling_text} | {ratio} | "
                f"{row['local_s']:.2f} s, {row['local_MBps']:.0f} MB/s |"
            )
    return "\n".join(lines)


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/download_bench.py", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller datasets, two runs each")
    parser.add_argument("--repeat", type=int, help="runs per measurement (median reported)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for noisy in ("azure", "blobmount"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.repeat:
        os.environ["BENCH_REPEAT"] = str(args.repeat)
    container = "download-bench"
    with AzuriteServer() as az:
        az.create_container(container)
        upload(az, container, args.quick)
        report = run(az.account_url, az.connection_string, container, args.quick)
    print(format_report(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
