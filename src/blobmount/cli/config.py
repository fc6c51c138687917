"""`blobmount config`: the effective settings, each with where its value came from; with --json
as one JSON object (secrets masked), for scripts and support requests."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from blobmount.settings import describe, describe_json, load_settings

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("config", help="print the effective settings")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print them as JSON: each variable's value, text and source, which credential "
        "variables are set (masked), and the DATASET_MOUNT_* variables that are ignored",
    )


def run(args: argparse.Namespace) -> int:
    settings = load_settings()
    if args.json:
        print(describe_json(settings))
        return 0
    rows = describe(settings)
    width = max(len(name) for name, _, _ in rows)
    for name, value, source in rows:
        print(f"{name:<{width}}  {value:<16} ({source})")
    return 0
