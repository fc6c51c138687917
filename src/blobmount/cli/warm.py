"""`blobmount warm MOUNTPOINT|URI [PATH...]`: the command line of cache warm-up.

On a mount point, warm reads through the live mount; on a URI (anything with ``://``), it mounts
the source on a temporary folder first and unmounts it after (see `blobmount.warm.runner`).

Exit status: 0 when every file was warmed or the cache filled up (the summary says which), 1
when a file failed or warm could not run, 128+N when stopped by signal N.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from typing import Any

from blobmount.cli.verbosity import add_flags as add_verbosity_flags
from blobmount.cli.verbosity import log_level
from blobmount.errors import ConfigError
from blobmount.logs import setup_logging
from blobmount.settings import load_settings
from blobmount.warm.report import summary_json, summary_lines
from blobmount.warm.runner import Signals, is_uri, warm_mount, warm_uri
from blobmount.warm.warmer import DEFAULT_JOBS, Interrupted, WarmResult

log = logging.getLogger(__name__)


def _jobs(text: str) -> int:
    if not (text.isdigit() and 1 <= int(text) <= 1024):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to 1024")
    return int(text)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "warm",
        help="fill a mount's disk cache with a subtree before a job reads it",
        description="Read the files under PATHs (default: all) through the mount at MOUNTPOINT, "
        "so that its disk cache holds them. Given a source URI instead, mount it on a "
        "temporary folder with the DATASET_MOUNT_* settings, warm, and unmount. Stops, with "
        "exit status 0, when one more file would start pruning the cache. See docs/WARM.md.",
    )
    parser.add_argument(
        "target",
        metavar="MOUNTPOINT|URI",
        help="a live blobmount mount point, or an az://, https://, wasbs:// or azureml:// URI",
    )
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="a file or folder inside the mount, absolute or relative to its root",
    )
    parser.add_argument(
        "-j",
        "--jobs",
        type=_jobs,
        default=DEFAULT_JOBS,
        metavar="N",
        help=f"files read at once (default {DEFAULT_JOBS})",
    )
    add_verbosity_flags(parser, command=True)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar or progress log lines"
    )
    parser.add_argument(
        "--anonymous",
        action="store_true",
        default=None,
        help="with a URI: no credentials (public containers)",
    )
    parser.add_argument(
        "--snapshot",
        metavar="SNAPSHOT_URI",
        help="with a URI: mount it with the namespace of this snapshot (see docs/SNAPSHOTS.md)",
    )


def exit_status(result: WarmResult) -> int:
    if result.interrupted is not None:
        return 128 + int(signal.Signals[result.interrupted])
    return 0 if result.ok else 1


def run(args: argparse.Namespace) -> int:
    # the flags that are settings: checked here first, and given to a temporary mount's daemon
    overrides = {
        "anonymous": args.anonymous,
        "snapshot": args.snapshot,
        "log_level": log_level(args),
    }
    settings = load_settings(**overrides)
    if args.snapshot is not None and not is_uri(args.target):
        raise ConfigError("--snapshot goes with a URI: a live mount has its namespace already")
    setup_logging(settings.log_level, stderr=True)
    signals = Signals()
    progress = not args.no_progress
    try:
        with signals.installed():
            if is_uri(args.target):
                warmed = warm_uri(
                    args.target,
                    args.paths,
                    signals,
                    jobs=args.jobs,
                    progress=progress,
                    overrides=overrides,
                )
            else:
                warmed = warm_mount(args.target, args.paths, jobs=args.jobs, progress=progress)
    except Interrupted as exc:  # before warming started, or while it was being set up
        print(f"blobmount: interrupted by {exc.args[0]}", file=sys.stderr)
        return 128 + int(signal.Signals[exc.args[0]])
    result = warmed.result
    if result.interrupted is None and signals.held is not None:
        result.interrupted = signals.held  # arrived while unmounting
    if args.json:
        print(json.dumps(summary_json(result, mountpoint=warmed.mountpoint, source=warmed.source)))
    else:
        for line in summary_lines(result):
            print(f"blobmount: {line}")
    sys.stdout.flush()
    return exit_status(result)
