"""`blobmount unmount MOUNTPOINT`: unmount gracefully (see `blobmount.launch.unmount`)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from blobmount.launch import unmount

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("unmount", help="unmount gracefully")
    parser.add_argument("mountpoint", type=Path)


def run(args: argparse.Namespace) -> int:
    unmount(args.mountpoint)
    print(f"blobmount: unmounted {args.mountpoint.absolute()}")
    return 0
