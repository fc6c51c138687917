"""Bytes of daemon memory per cached folder entry (issue #8: aim for under 300 with 1,000,000).

Lists one flat folder of N blobs through `BlobFilesystem` the way the kernel does with
readdirplus (call after call; every accepted entry becomes a looked-up inode), so both halves of
the metadata cache are full: the folder's listing and the inode table. Reports the growth of the
process's RSS (and, with --tracemalloc, of Python's traced allocations) divided by N.

The storage is synthetic: list pages are generated on request, with Azure-like names, sizes,
ETags and times, so nothing but the mount's own cache stays in memory.

    .venv/bin/python benchmarks/metadata_memory.py                 # 1,000,000 entries
    .venv/bin/python benchmarks/metadata_memory.py --entries 200000 --json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from blobmount.blocks.manager import BlockManager, BlockManagerConfig  # noqa: E402
from blobmount.fs.filesystem import BlobFilesystem, FsConfig  # noqa: E402
from blobmount.namespace.inodes import ROOT_INODE  # noqa: E402
from blobmount.storage.base import MAX_LIST_PAGE, BlobProps, ListPage, StorageClient  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--tracemalloc", action="store_true", help="also trace allocations")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = trio.run(fill, args.entries, args.tracemalloc)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['entries']:,} entries, {result['inodes']:,} inodes")
        print(f"RSS: {result['rss_bytes_per_entry']:.0f} bytes per entry")
        if "traced_bytes_per_entry" in result:
            print(f"tracemalloc: {result['traced_bytes_per_entry']:.0f} bytes per entry")
        print(f"listing through the filesystem layer: {result['list_seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
