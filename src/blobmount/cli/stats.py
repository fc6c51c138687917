"""`blobmount stats MOUNTPOINT [--json]`: a live mount's statistics, read from its stats socket."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from blobmount.runstate import stats_socket
from blobmount.stats import fetch_snapshot, format_stats

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("stats", help="show a live mount's statistics")
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    return run_stats(args.mountpoint, as_json=args.json)


def run_stats(mountpoint: Path, *, as_json: bool) -> int:
    try:
        snapshot = fetch_snapshot(stats_socket(mountpoint.absolute()))
    except OSError as exc:
        print(f"blobmount: no live mount at {mountpoint} ({exc.strerror or exc})", file=sys.stderr)
        return 1
    print(json.dumps(snapshot.to_json(), indent=2) if as_json else format_stats(snapshot))
    return 0
