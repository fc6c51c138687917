"""`blobmount download URI DEST` (issue 6; being built)."""

from __future__ import annotations

import argparse
from typing import Any


def add_download_parser(sub: Any) -> None:
    parser = sub.add_parser("download", help="copy a container or prefix to a local folder")
    parser.add_argument("uri")
    parser.add_argument("dest")


def run_download(args: argparse.Namespace) -> int:
    print("blobmount: download is not implemented yet")
    return 2
