"""`blobmount config`: the effective settings, each with where its value came from."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from blobmount.settings import describe, load_settings

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    sub.add_parser("config", help="print the effective settings")


def run(args: argparse.Namespace) -> int:
    rows = describe(load_settings())
    width = max(len(name) for name, _, _ in rows)
    for name, value, source in rows:
        print(f"{name:<{width}}  {value:<16} ({source})")
    return 0
