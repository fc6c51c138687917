"""`blobmount cache info [DIR]` and `blobmount cache clear [DIR]`.

DIR defaults to DATASET_MOUNT_CACHE_DIR. `info` only reads: size, entries, temporaries, whether a
live mount uses the directory, and a breakdown per container.

`clear` removes every cache entry (all kinds, all containers) and keeps the directory, its
CACHEDIR.TAG and lock files. It refuses while a live mount holds the directory (every mount
holds a shared flock on DIR/.lock for its lifetime; the kernel drops it when the daemon dies,
even by SIGKILL), because emptying a cache under a running job silently turns its next epoch into
a full download. `--force` clears anyway: that is safe for the mount (a missing block is a miss,
and files a reader has open stay readable until closed), just slow for it. It also refuses a
directory without blobmount's CACHEDIR.TAG, so a mistyped path never loses data.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from blobmount.cachedir.layout import CacheLayout, DirLock, free_bytes
from blobmount.settings import load_settings
from blobmount.units import format_size

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    cache = sub.add_parser(
        "cache",
        help="inspect or clear a disk cache directory",
        description="Inspect or clear a disk cache directory (default: DATASET_MOUNT_CACHE_DIR).",
    )
    actions = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    info = actions.add_parser("info", help="size, entries and a breakdown per container")
    info.add_argument("dir", nargs="?", type=Path, help="cache directory")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    clear = actions.add_parser(
        "clear", help="remove every cache entry (refused while a mount uses the directory)"
    )
    clear.add_argument("dir", nargs="?", type=Path, help="cache directory")
    clear.add_argument(
        "--force",
        action="store_true",
        help="clear even while a mount uses the directory (it refetches what it loses)",
    )


def run(args: argparse.Namespace) -> int:
    root = args.dir
    if root is None:
        root = load_settings().cache_dir
    root = Path(root).absolute()
    if args.cache_command == "info":
        return _info(root, as_json=args.json)
    if args.cache_command == "clear":
        return _clear(root, force=args.force)
    return 2


def cache_info(root: Path) -> dict[str, Any]:
    """What `cache info --json` prints. Read-only (stale temporaries are counted, not removed)."""
    scan = CacheLayout(root).scan(remove_stale_temporaries=False)
    free, _ = free_bytes(root)
    locations = sorted(scan.locations.items(), key=lambda item: -item[1].size_bytes)
    return {
        "dir": str(root),
        "entries": scan.entries,
        "size_bytes": scan.entry_bytes,
        "temporaries": scan.temporaries + scan.own_temporaries,
        "temporary_bytes": scan.temporary_bytes,
        "in_use": in_use(root),
        "disk_free_bytes": free,
        "locations": [
            {
                "kind": kind,
                "location": usage.location,
                "entries": usage.entries,
                "size_bytes": usage.size_bytes,
            }
            for (kind, _), usage in locations
        ],
    }


def in_use(root: Path) -> bool:
    """True if a live mount holds the directory."""
    lock = DirLock(CacheLayout(root).lock_path)
    if lock.acquire(shared=False):
        lock.release()
        return False
    return True


def _info(root: Path, *, as_json: bool) -> int:
    if not root.is_dir():
        print(f"blobmount: {root} does not exist", file=sys.stderr)
        return 1
    if not CacheLayout(root).is_cache():
        print(f"blobmount: {root} is not a blobmount cache (no CACHEDIR.TAG)", file=sys.stderr)
        return 1
    info = cache_info(root)
    if as_json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"cache directory  {info['dir']}")
    print(f"size             {format_size(info['size_bytes'])} in {info['entries']} entries")
    if info["temporaries"]:
        print(
            f"temporaries      {info['temporaries']} ({format_size(info['temporary_bytes'])}; "
            "writes in progress, or left by a crash and removed by the next mount)"
        )
    print(f"in use           {'yes, by a live mount' if info['in_use'] else 'no'}")
    print(f"disk free        {format_size(info['disk_free_bytes'])}")
    if info["locations"]:
        print("per container:")
        width = max(len(loc["location"]) for loc in info["locations"])
        for loc in info["locations"]:
            print(
                f"  {loc['location']:<{width}}  {loc['kind']:<6}  {loc['entries']:>8} entries  "
                f"{format_size(loc['size_bytes']):>10}"
            )
    return 0


def _clear(root: Path, *, force: bool) -> int:
    if not root.exists():
        print(f"blobmount: {root} does not exist; nothing to clear")
        return 0
    layout = CacheLayout(root)
    if not layout.is_cache():
        print(
            f"blobmount: {root} is not a blobmount cache (no CACHEDIR.TAG); not touching it",
            file=sys.stderr,
        )
        return 1
    lock = DirLock(layout.lock_path)
    if not lock.acquire(shared=False):
        if not force:
            print(
                f"blobmount: {root} is in use by a live mount; unmount it first, or pass --force "
                "(the mount then fetches again what it loses)",
                file=sys.stderr,
            )
            return 1
        print(f"blobmount: warning: {root} is in use by a live mount; clearing anyway")
    try:
        files, size = layout.clear()
    except OSError as exc:
        print(f"blobmount: cannot clear {root}: {os.strerror(exc.errno or 0)}", file=sys.stderr)
        return 1
    finally:
        lock.release()
    print(f"blobmount: removed {files} entries ({format_size(size)}) from {root}")
    return 0
