"""Bytes of daemon memory per cached folder entry (issue #8: aim for under 300 with 1,000,000).

Lists one flat folder of N blobs through `BlobFilesystem` the way the kernel does with
readdirplus (call after call; every accepted entry becomes a looked-up inode), so both halves of
the metadata cache are full: the folder's listing and the inode table. Reports the growth of the
process's RSS (and, with --tracemalloc, of Python's traced allocations) divided by N.

The storage is synthetic: list pages are generated on request, with Azure-like names, sizes,
ETags and times, so nothing but the mount's own cache stays in memory.

With --fuse, the real daemon (`blobmount.daemon.serve`, pyfuse3, the kernel's readdirplus) serves
the synthetic folder on a temporary mount point in a child process, and this process lists it
with os.scandir and reads the child's RSS. (Root and /dev/fuse needed.) With --fuse --azurite,
the daemon is `blobmount mount` of a seeded Azurite: the Azure SDK's page parsing is in the
figure too (a fixed ~40 MiB high-water mark of the first pages, so the cost per entry falls as
the folder grows; Azurite cannot load much more than 300,000 blobs).

    .venv/bin/python benchmarks/metadata_memory.py                 # 1,000,000 entries
    .venv/bin/python benchmarks/metadata_memory.py --entries 200000 --json
    .venv/bin/python benchmarks/metadata_memory.py --fuse
    .venv/bin/python benchmarks/metadata_memory.py --fuse --azurite --entries 300000
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import trio

from blobmount.blocks.manager import BlockManager, BlockManagerConfig
from blobmount.fs.filesystem import BlobFilesystem, FsConfig
from blobmount.namespace.inodes import ROOT_INODE
from blobmount.storage.base import MAX_LIST_PAGE, BlobProps, ListPage, StorageClient

FOLDER = "images"
BLOCK = 4 * 1024 * 1024


def blob_name(i: int) -> str:
    return f"{FOLDER}/img_{i:07d}.jpg"


class SyntheticFlatFolder(StorageClient):
    """One folder of `count` blobs, listed page by page without holding any of them."""

    location = "synthetic/container"

    def __init__(self, count: int) -> None:
        self.count = count

    def props(self, i: int) -> BlobProps:
        return BlobProps(
            name=blob_name(i),
            size=80_000 + (i * 7919) % 60_000,  # JPEG-sized, never a cached small int
            etag=f'"0x8DC{i:012X}"',  # Azure's shape: 0x and 15 hex digits, quoted
            last_modified=1.7e9 + i,
        )

    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        continuation: str | None = None,
        max_results: int = MAX_LIST_PAGE,
    ) -> ListPage:
        await trio.lowlevel.checkpoint()
        if prefix == "" and delimiter == "/":
            return ListPage((), (f"{FOLDER}/",), None)
        if not f"{FOLDER}/".startswith(prefix) and not prefix.startswith(f"{FOLDER}/"):
            return ListPage((), (), None)
        start = int(continuation) if continuation else 0
        end = min(self.count, start + max_results)
        blobs = tuple(self.props(i) for i in range(start, end) if blob_name(i).startswith(prefix))
        return ListPage(blobs, (), str(end) if end < self.count else None)

    async def get_properties(self, name: str) -> BlobProps:
        from blobmount.errors import BlobNotFound

        raise BlobNotFound(name)

    async def get_range(self, name: str, etag: str, start: int, length: int) -> bytes:
        raise NotImplementedError


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def fill(entries: int, trace: bool) -> dict[str, float]:
    storage = SyntheticFlatFolder(entries)
    async with trio.open_nursery() as nursery:
        blocks = BlockManager(storage, BlockManagerConfig(BLOCK, 4, 4, 0, 16 * BLOCK), nursery)
        cfg = FsConfig("", None, 0, 0, 0o444, 0o555, 1.7e9, BLOCK, listing_mode="auto")
        fs = BlobFilesystem(storage, blocks, cfg)
        folder = await fs.lookup(ROOT_INODE, FOLDER)
        assert folder is not None
        gc.collect()
        if trace:
            tracemalloc.start()
        rss_before = rss_bytes()
        started = time.perf_counter()
        fh = await fs.opendir(folder.inode)
        accepted = [0]

        def reply(name: str, attr: object, next_id: int) -> bool:
            accepted[0] = next_id
            return True

        start = -1
        while start != accepted[0]:  # like the kernel: call after call, nothing kept here
            start = accepted[0]
            await fs.readdir(fh, start, reply)
        seconds = time.perf_counter() - started
        gc.collect()
        rss_after = rss_bytes()
        traced = tracemalloc.get_traced_memory()[0] if trace else 0
        tracemalloc.stop()
        assert accepted[0] == entries, f"listed {accepted[0]} of {entries}"
        inodes = fs.statistics().inodes
        fs.releasedir(fh)
        nursery.cancel_scope.cancel()
    result = {
        "entries": entries,
        "inodes": inodes,
        "rss_bytes_per_entry": (rss_after - rss_before) / entries,
        "list_seconds": seconds,
    }
    if trace:
        result["traced_bytes_per_entry"] = traced / entries
    return result


def serve(mountpoint: str, entries: int) -> None:
    """The daemon, as `blobmount mount` runs it, over the synthetic folder."""
    from blobmount.daemon import MountRequest, serve
    from blobmount.readiness import ReadyNotifier
    from blobmount.settings import load_settings
    from blobmount.source import parse_source

    @contextlib.asynccontextmanager
    async def synthetic() -> AsyncIterator[StorageClient]:
        yield SyntheticFlatFolder(entries)

    spec = parse_source("http://127.0.0.1:9/devstoreaccount1/synthetic")  # never contacted
    request = MountRequest(spec, Path(mountpoint), load_settings())
    trio.run(serve, request, ReadyNotifier({}), synthetic)


def vm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def mounted(path: str) -> bool:
    with open("/proc/mounts") as mounts:
        return any(line.split()[1] == path for line in mounts)


@contextlib.contextmanager
def daemon_for(entries: int, azurite: bool, mnt: str) -> Iterator[tuple[list[str], dict[str, str]]]:
    """The daemon's command line and environment: this script serving the synthetic folder, or
    `blobmount mount` of an Azurite seeded with the same names (the mount's root is then the
    folder, so the daemon's start-up probe has listed its first page before the clock)."""
    if not azurite:
        yield [sys.executable, __file__, "--serve", mnt, "--entries", str(entries)], {}
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests/helpers/
    from tests.helpers.azurite_seed import SeededAzurite

    blobs = [(blob_name(i), f"{i}\n".encode()) for i in range(entries)]
    with SeededAzurite({"memory": blobs}) as az:
        del blobs
        uri = f"{az.account_url}/memory/{FOLDER}"
        env = {"AZURE_STORAGE_CONNECTION_STRING": az.connection_string}
        yield [sys.executable, "-m", "blobmount", "mount", "--foreground", uri, mnt], env


def through_fuse(entries: int, azurite: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="blobmount-memory-") as tmp:
        mnt = os.path.join(tmp, "mnt")
        os.mkdir(mnt)
        folder = mnt if azurite else os.path.join(mnt, FOLDER)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DATASET_", "AZURE_"))}
        env["DATASET_MOUNT_CACHE_DIR"] = os.path.join(tmp, "cache")
        with daemon_for(entries, azurite, mnt) as (cmd, extra):
            child = subprocess.Popen(cmd, env={**env, **extra})
            try:
                deadline = time.monotonic() + 120
                while not mounted(mnt):
                    if child.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("the daemon did not mount")
                    time.sleep(0.1)
                os.stat(folder)
                time.sleep(1)  # the daemon's own start-up probe
                before = vm_rss(child.pid)
                started = time.perf_counter()
                with os.scandir(folder) as listing:
                    count = sum(1 for _ in listing)
                seconds = time.perf_counter() - started
                after = vm_rss(child.pid)
                assert count == entries, f"listed {count} of {entries}"
            finally:
                subprocess.run(["fusermount3", "-u", mnt], check=False)
                try:
                    child.wait(30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
    new = entries - MAX_LIST_PAGE if azurite else entries  # the probe's page was there before
    return {
        "entries": entries,
        "inodes": count,
        "rss_bytes_per_entry": (after - before) / new,
        "list_seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--tracemalloc", action="store_true", help="also trace allocations")
    parser.add_argument("--fuse", action="store_true", help="measure the real daemon's RSS")
    parser.add_argument(
        "--azurite",
        action="store_true",
        help="with --fuse: blobmount mount of a seeded Azurite (Azure client and all) rather "
        "than the synthetic folder; up to a few 100,000 entries",
    )
    parser.add_argument("--serve", metavar="MOUNTPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.entries)
        return 0
    if args.fuse:
        result = through_fuse(args.entries, args.azurite)
    else:
        result = trio.run(fill, args.entries, args.tracemalloc)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['entries']:,} entries, {result['inodes']:,} inodes")
        print(f"RSS: {result['rss_bytes_per_entry']:.0f} bytes per entry")
        if "traced_bytes_per_entry" in result:
            print(f"tracemalloc: {result['traced_bytes_per_entry']:.0f} bytes per entry")
        how = "os.scandir through the mount" if args.fuse else "the filesystem layer"
        print(f"listing through {how}: {result['list_seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
