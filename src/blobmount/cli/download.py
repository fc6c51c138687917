"""`blobmount download URI DEST`: the command line of download mode.

Same URI forms, credentials and settings as `mount`; the run itself (the storage stack under a
`Downloader`, signals) is `blobmount.compose.download`, shared with the Python API.
RSLEX_DOWNLOADER_THREADS sets the transfers in flight, AZUREML_DATASET_HTTP_RETRY_COUNT the
retries. Progress goes to stderr (a bar on a terminal, log lines otherwise); the summary goes
to stdout, as text or, with --json, as one JSON object.

Exit status: 0 when every blob under the prefix was copied (or was already current), 1 when
any blob failed or was refused (they are listed with the reason), 128+N when stopped by signal
N (130 for Ctrl-C, 143 for SIGTERM); when the download cannot run, the status of the error's
kind (`blobmount.errors.ExitStatus`: 2 a bad setting, URI or glob, 3 credentials, 4 storage).

The resume state (which local files are current copies of which blob versions) is kept outside
DEST, in $XDG_STATE_HOME/blobmount/downloads: DEST holds the prefix's files and nothing else.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import trio

from blobmount.cli.verbosity import add_flags as add_verbosity_flags
from blobmount.cli.verbosity import log_level
from blobmount.compose.download import Outcome, download_config, run_download
from blobmount.datastores import resolve_source
from blobmount.download_mode.progress import summary_json, summary_lines
from blobmount.download_mode.transfer import DEFAULT_PART_SIZE
from blobmount.logs import setup_logging
from blobmount.settings import load_settings
from blobmount.units import KiB, MiB, format_size, parse_size

log = logging.getLogger(__name__)

MIN_PART_SIZE = 64 * KiB
MAX_PART_SIZE = 256 * MiB


def _part_size(text: str) -> int:
    try:
        size = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not MIN_PART_SIZE <= size <= MAX_PART_SIZE:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not between {format_size(MIN_PART_SIZE)} and {format_size(MAX_PART_SIZE)}"
        )
    return size


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "download",
        help="copy a container or prefix to a local folder",
        description="Copy every blob under URI to DEST, keeping the folder structure. A rerun "
        "skips files already current and fetches the rest. Transfers: RSLEX_DOWNLOADER_THREADS "
        "(default 4 x cores); retries: AZUREML_DATASET_HTTP_RETRY_COUNT. See docs/DOWNLOAD.md.",
    )
    parser.add_argument(
        "uri", help="az://, https://, http:// (Azurite), wasbs:// or azureml:// URI"
    )
    parser.add_argument("dest", type=Path, help="local folder (created if missing)")
    parser.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="GLOB",
        help="download only paths (relative to the prefix) matching GLOB; repeatable",
    )
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="leave out paths matching GLOB; repeatable; wins over --include",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="check Content-MD5 where the blob has one (also of files already present)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="concurrent transfers (overrides RSLEX_DOWNLOADER_THREADS)",
    )
    parser.add_argument(
        "--part-size",
        type=_part_size,
        default=DEFAULT_PART_SIZE,
        metavar="SIZE",
        help="blobs larger than this are fetched in parallel parts of this size (default 8MB)",
    )
    parser.add_argument(
        "--page-cache",
        action="store_true",
        help="write every file through the page cache, so it stays in memory for a read right "
        "after (costs more CPU); by default files of 1 MiB or more are written with O_DIRECT "
        "where the file system allows",
    )
    add_verbosity_flags(parser, command=True)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar or progress log lines"
    )
    parser.add_argument(
        "--anonymous", action="store_true", default=None, help="no credentials (public containers)"
    )
    parser.add_argument(
        "--snapshot",
        metavar="SNAPSHOT_URI",
        help="copy the blobs this snapshot records, at their recorded versions (no listing)",
    )


def exit_status(outcome: Outcome) -> int:
    if outcome.interrupted is not None:
        return 128 + int(signal.Signals[outcome.interrupted])
    return 0 if outcome.result.ok else 1


def run(args: argparse.Namespace) -> int:
    settings = load_settings(
        downloader_threads=args.threads,
        anonymous=args.anonymous,
        snapshot=args.snapshot,
        log_level=log_level(args),  # -v / --debug
    )
    spec = resolve_source(args.uri)
    setup_logging(settings.log_level, stderr=True)
    config = download_config(
        settings,
        spec,
        args.dest,
        part_size=args.part_size,
        verify=args.verify,
        includes=tuple(args.include),
        excludes=tuple(args.exclude),
        direct_io=not args.page_cache,
    )
    log.info(
        "downloading %s to %s (%d transfers, parts of %s)",
        spec.display,
        config.dest,
        config.transfers,
        format_size(config.part_size),
    )
    outcome = trio.run(run_download, settings, spec, config, not args.no_progress)
    if args.json:
        extra = {"requests": outcome.requests, "retries": outcome.retries}
        summary = summary_json(outcome.result, interrupted=outcome.interrupted, extra=extra)
        print(json.dumps(summary))
    else:
        for line in summary_lines(outcome.result, interrupted=outcome.interrupted):
            print(f"blobmount: {line}")
    sys.stdout.flush()
    return exit_status(outcome)
