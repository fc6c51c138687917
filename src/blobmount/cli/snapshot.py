"""`blobmount snapshot create|show|diff`: record one version of a dataset, look at it, compare.

`create SOURCE_URI SNAPSHOT_URI` lists the source once (flat) and writes the snapshot, to a
local path or a blob URI in any source form; mounts, downloads and warm-ups given it with
`--snapshot` (or DATASET_MOUNT_SNAPSHOT) take their namespace from it. See docs/SNAPSHOTS.md.
The work is `blobmount.compose.snapshots`, shared with the Python API.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

import trio

from blobmount.cli.verbosity import add_flags as add_verbosity_flags
from blobmount.cli.verbosity import log_level
from blobmount.compose.snapshots import (
    CreatedSnapshot,
    SnapshotInfo,
    create_snapshot,
    diff_snapshots,
    snapshot_info,
)
from blobmount.datastores import resolve_source
from blobmount.logs import setup_logging
from blobmount.settings import load_settings
from blobmount.snapshots.diff import SnapshotDiff
from blobmount.snapshots.format import SnapshotHeader
from blobmount.units import format_size

log = logging.getLogger(__name__)

_WHERE = "a local path, or a blob URI (az://, https://, wasbs:// or azureml://)"


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "snapshot",
        help="record a dataset's names, sizes and ETags, so every node mounts the same version",
        description="A snapshot records every blob under a source (name, size, ETag, "
        "last-modified, Content-MD5). A mount, download or warm-up given --snapshot takes its "
        "whole namespace from it, without listing, and reads only the recorded versions. See "
        "docs/SNAPSHOTS.md.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser(
        "create",
        help="list a source once and write its snapshot",
        description="List every blob under SOURCE_URI (one flat listing) and write the "
        "snapshot to SNAPSHOT_URI atomically.",
    )
    create.add_argument("source", metavar="SOURCE_URI", help="the dataset, as for `mount`")
    create.add_argument("target", metavar="SNAPSHOT_URI", help=f"where to write it: {_WHERE}")
    create.add_argument(
        "--anonymous", action="store_true", default=None, help="no credentials (public containers)"
    )
    create.add_argument("--json", action="store_true", help="print the result as JSON")
    show = actions.add_parser("show", help="print a snapshot's source, time, entries and bytes")
    show.add_argument("target", metavar="SNAPSHOT_URI", help=_WHERE)
    show.add_argument("--json", action="store_true", help="print it as JSON")
    compare = actions.add_parser("diff", help="list blobs added, removed and changed from A to B")
    compare.add_argument("old", metavar="A", help=f"the older snapshot: {_WHERE}")
    compare.add_argument("new", metavar="B", help="the newer snapshot")
    compare.add_argument("--json", action="store_true", help="print the differences as JSON")
    for action in (create, show, compare):
        add_verbosity_flags(action, command=True)
    for action in (show, compare):
        action.add_argument(
            "--anonymous",
            action="store_true",
            default=None,
            help="no credentials (a snapshot in a public container)",
        )


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _header_json(header: SnapshotHeader) -> dict[str, Any]:
    return {
        "source": header.source,
        "location": header.location,
        "prefix": header.prefix,
        "created": _utc(header.created),
        "entries": header.entries,
        "total_bytes": header.total_bytes,
        "format_version": header.version,
        "writer": header.writer,
    }


def _per_entry(file_bytes: int, entries: int) -> str:
    return f"{file_bytes / entries:.1f} bytes an entry" if entries else "no entries"


def _print_created(made: CreatedSnapshot, as_json: bool) -> None:
    header = made.header
    if as_json:
        out = {
            **_header_json(header),
            "snapshot": made.where,
            "file_bytes": made.file_bytes,
            "list_requests": made.list_requests,
        }
        print(json.dumps(out))
        return
    print(
        f"blobmount: snapshot of {header.source} written to {made.where}: "
        f"{header.entries} entries, {header.total_bytes} bytes "
        f"({format_size(header.total_bytes)}); file {format_size(made.file_bytes)} "
        f"({_per_entry(made.file_bytes, header.entries)}), {made.list_requests} list requests"
    )


def _print_info(info: SnapshotInfo, as_json: bool) -> None:
    header = info.header
    if as_json:
        print(json.dumps({**_header_json(header), "file_bytes": info.file_bytes}))
        return
    rows = (
        ("snapshot", info.where),
        ("source", header.source),
        ("container", header.location),
        ("created", _utc(header.created)),
        ("entries", str(header.entries)),
        ("bytes", f"{header.total_bytes} ({format_size(header.total_bytes)})"),
        ("file", f"{format_size(info.file_bytes)} ({_per_entry(info.file_bytes, header.entries)})"),
        ("format", f"version {header.version}, written by {header.writer or 'unknown'}"),
    )
    for key, value in rows:
        print(f"{key + ':':<11}{value}")


def _print_diff(changes: SnapshotDiff, as_json: bool) -> None:
    if as_json:
        changed = [
            {
                "name": c.name,
                "old_size": c.old_size,
                "new_size": c.new_size,
                "old_etag": c.old_etag,
                "new_etag": c.new_etag,
            }
            for c in changes.changed
        ]
        out = {"added": list(changes.added), "removed": list(changes.removed), "changed": changed}
        print(json.dumps(out))
        return
    for name in changes.added:
        print(f"+ {name}")
    for name in changes.removed:
        print(f"- {name}")
    for c in changes.changed:
        size = f"{c.old_size} -> {c.new_size} bytes" if c.old_size != c.new_size else "same size"
        print(f"~ {c.name} ({size}, ETag {c.old_etag} -> {c.new_etag})")
    print(
        f"blobmount: {len(changes.added)} added, {len(changes.removed)} removed, "
        f"{len(changes.changed)} changed"
    )


def run(args: argparse.Namespace) -> int:
    settings = load_settings(anonymous=args.anonymous, log_level=log_level(args))
    setup_logging(settings.log_level, stderr=True)
    if args.action == "create":
        spec = resolve_source(args.source)
        made = trio.run(create_snapshot, settings, spec, args.target)
        _print_created(made, args.json)
    elif args.action == "show":
        _print_info(trio.run(snapshot_info, settings, args.target), args.json)
    else:
        _print_diff(trio.run(diff_snapshots, settings, args.old, args.new), args.json)
    return 0
