"""Command line: `blobmount mount|unmount|stats|config|datastores|download|cache|warm`.

One module per command, each with `add_parser(sub)` and `run(args)`; this module assembles the
parser and turns a `BlobmountError` into a one-line message and exit status 1. The work the
Python API shares with the commands lives below the front ends (`blobmount.launch`,
`blobmount.compose`, `blobmount.warm.runner`). Building the parser imports neither pyfuse3 nor
the Azure SDK, so `--help` works on a machine without FUSE.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Protocol

from blobmount._version import __version__
from blobmount.cli import cache, config, datastores, download, mount, stats, unmount, warm
from blobmount.errors import BlobmountError

log = logging.getLogger(__name__)


class Command(Protocol):
    """What each command's module provides."""

    def add_parser(self, sub: Any) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


#: the commands, in the order `--help` lists them
COMMANDS: dict[str, Command] = {
    "mount": mount,
    "unmount": unmount,
    "stats": stats,
    "config": config,
    "datastores": datastores,
    "download": download,
    "cache": cache,
    "warm": warm,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="blobmount",
        description="Mount an Azure Blob container (or a prefix of it) as a read-only folder.",
    )
    parser.add_argument("--version", action="version", version=f"blobmount {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except BlobmountError as exc:
        print(f"blobmount: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
