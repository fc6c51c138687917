"""Command line: `blobmount mount|unmount|stats|config|datastores|download|cache|warm|snapshot`.

One module per command, each with `add_parser(sub)` and `run(args)`; this module assembles the
parser and turns a `BlobmountError` into a one-line message and the exit status of its kind
(`blobmount.errors.exit_status`: 2 usage or configuration, 3 credentials, 4 storage not reachable
or not found, 1 anything else). The work the
Python API shares with the commands lives below the front ends (`blobmount.launch`,
`blobmount.compose`, `blobmount.warm.runner`). Building the parser imports neither pyfuse3 nor
the Azure SDK, so `--help` works on a machine without FUSE.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import sys
from typing import Any, Protocol

from blobmount._version import __version__
from blobmount.cli import cache, config, datastores, download, mount, snapshot, stats, unmount, warm
from blobmount.cli.verbosity import add_flags, early_level
from blobmount.errors import BlobmountError, ExitStatus, exit_status
from blobmount.logs import RedactingFormatter

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
    "snapshot": snapshot,
}


EXIT_STATUSES = f"""exit status:
  {ExitStatus.OK}  success
  {ExitStatus.USAGE}  usage or configuration: a bad argument, setting, URI or mount point
  {ExitStatus.CREDENTIALS}  storage refused the credentials, or no token could be had
  {ExitStatus.STORAGE}  storage not reachable, or the container or blob not found
  {ExitStatus.FAILED}  anything else (`download` and `warm`: a file failed; 128+N: signal N)"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="blobmount",
        description="Mount an Azure Blob container (or a prefix of it) as a read-only folder.",
        epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"blobmount {__version__}")
    add_flags(parser, command=False)  # also after `mount`, `download` and `warm`
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def _warnings_to_stderr(level: int = logging.WARNING) -> None:
    """Until a command sets up its own logging, warnings (an unknown DATASET_MOUNT_* variable)
    go to stderr as one line each, like the command's own messages; with -v or --debug, INFO or
    DEBUG records too (the only log of the commands that set up none)."""
    root = logging.getLogger()
    if root.handlers:  # set up already (a test's capture, or a caller's own)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter("blobmount: %(message)s"))
    handler.setLevel(level)
    root.addHandler(handler)
    if level < logging.WARNING:
        root.setLevel(level)


def _stacks_on_sigusr1() -> None:
    """`kill -USR1 PID` writes every thread's Python stack to stderr (a background mount's log
    file) and the process goes on: what a stuck process waits on, even when its main thread is
    blocked in a system call (docs/OPERATIONS.md, "A stuck process")."""
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    except (AttributeError, ValueError, OSError, RuntimeError):
        pass  # no usable stderr (closed, or not a file): nothing to write the stacks to


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _stacks_on_sigusr1()
    _warnings_to_stderr(early_level(args))
    try:
        return COMMANDS[args.command].run(args)
    except BlobmountError as exc:
        print(f"blobmount: {exc}", file=sys.stderr)
        return exit_status(exc)
    except OSError as exc:
        # a file or folder the command needed (cache, destination, state): no traceback, but
        # what failed and where
        where = f": {exc.filename}" if exc.filename else ""
        print(f"blobmount: {exc.strerror or exc}{where}", file=sys.stderr)
        return ExitStatus.FAILED
    except KeyboardInterrupt:
        return 130
