"""`blobmount warm MOUNTPOINT|URI [PATH...]`: the command line of cache warm-up.

On a mount point, warm reads through the live mount and watches its stats socket. On a URI
(anything with ``://``), it first mounts the source on a private temporary folder through the
same code path as ``blobmount mount`` (`blobmount.api.mount`, so the same DATASET_MOUNT_*
settings apply), warms, and unmounts, also after a failure or a signal. Signals that arrive
while that mount starts or stops are held back until it has, so a Ctrl-C never leaves a
mount behind.

Exit status: 0 when every file was warmed or the cache filled up (the summary says which), 1
when a file failed or warm could not run, 128+N when stopped by signal N.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from blobmount.errors import BlobmountError
from blobmount.warm.warmer import DEFAULT_JOBS, Interrupted, WarmResult

log = logging.getLogger(__name__)


class NotAMount(BlobmountError):
    """The first argument is neither a live mount nor a URI."""


def _jobs(text: str) -> int:
    if not (text.isdigit() and 1 <= int(text) <= 1024):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to 1024")
    return int(text)


def add_warm_parser(sub: Any) -> None:
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


# -- signals -----------------------------------------------------------------------------------


class _Signals:
    """SIGINT and SIGTERM raise `Interrupted` in the main thread, or, while `held`, are kept
    and raised by `raise_held` (used around starting and stopping a mount)."""

    def __init__(self) -> None:
        self.holding = False
        self.held: str | None = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.holding:
            self.held = self.held or name
            return
        raise Interrupted(name)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        previous = {s: signal.signal(s, self._handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    @contextlib.contextmanager
    def holding_back(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        finally:
            self.holding = False

    def hold(self) -> None:
        self.holding = True

    def raise_held(self) -> None:
        if self.held is not None:
            raise Interrupted(self.held)


# -- running -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Warmed:
    result: WarmResult
    mountpoint: str
    source: str


def is_uri(target: str) -> bool:
    return "://" in target


def live_mount(target: str) -> tuple[str, Path, dict[str, Any]]:
    """(the daemon's mount point, its stats socket, a first snapshot) for `target`.

    Raises:
        NotAMount: nothing answers for `target`.
    """
    from blobmount.runstate import stats_socket
    from blobmount.stats import fetch_stats

    given = os.path.abspath(target)
    problem = "nothing answers on its stats socket"
    # the daemon knows its mount point as it was given: try the path as typed, then resolved
    for candidate in dict.fromkeys([given, os.path.realpath(given)]):
        socket_path = stats_socket(Path(candidate))
        try:
            snapshot = fetch_stats(socket_path)
        except (FileNotFoundError, ConnectionRefusedError):
            continue
        except OSError as exc:  # e.g. another user's mount: say so rather than "no mount"
            problem = f"its stats socket {socket_path}: {exc.strerror or exc}"
            continue
        return str(snapshot["mountpoint"]), socket_path, snapshot
    raise NotAMount(
        f"{target} is not a live blobmount mount ({problem}); to warm a source before "
        "mounting it, give its URI"
    )


def warm_mount(mountpoint: str, paths: Sequence[str], *, jobs: int, progress: bool) -> Warmed:
    """Warm PATHs of the live mount at `mountpoint`.

    Raises:
        NotAMount, WarmPathError, NoDiskCache, WarmAborted.
    """
    from blobmount.progress import logging_around
    from blobmount.stats import fetch_stats
    from blobmount.warm.report import BarReporter, make_reporter
    from blobmount.warm.targets import check_targets, resolve_targets
    from blobmount.warm.warmer import Warmer

    root, socket_path, snapshot = live_mount(mountpoint)
    targets = resolve_targets(root, paths)
    check_targets(root, targets)
    reporter = make_reporter(progress)
    warmer = Warmer(root, targets, lambda: fetch_stats(socket_path), jobs=jobs, progress=reporter)
    log.info("warming %s (%s mode, %d files at once)", root, warmer.result.mode, warmer.jobs)
    try:
        with logging_around(isinstance(reporter, BarReporter)):
            result = warmer.run()
    finally:
        if reporter is not None:
            reporter.close()
    return Warmed(result, root, str(snapshot["source"]))


def warm_uri(
    uri: str,
    paths: Sequence[str],
    signals: _Signals,
    *,
    jobs: int,
    progress: bool,
    anonymous: bool | None,
) -> Warmed:
    """Mount `uri` on a temporary folder, warm PATHs (relative to its root), unmount."""
    from blobmount.api import mount
    from blobmount.datastores import resolve_source
    from blobmount.warm.targets import WarmPathError

    absolute = [p for p in paths if os.path.isabs(p)]
    if absolute:
        raise WarmPathError(f"with a URI, PATHs are relative to its root, not {absolute[0]}")
    with contextlib.ExitStack() as stack:
        with signals.holding_back():
            root = stack.enter_context(mount(uri, anonymous=anonymous))
        stack.callback(signals.hold)  # runs first on the way out: unmounting is not cut short
        signals.raise_held()
        log.info("mounted %s at %s for warming", resolve_source(uri).display, root)
        return warm_mount(str(root), paths, jobs=jobs, progress=progress)


def exit_status(result: WarmResult) -> int:
    if result.interrupted is not None:
        return 128 + int(signal.Signals[result.interrupted])
    return 0 if result.ok else 1


def run_warm(args: argparse.Namespace) -> int:
    from blobmount.logs import setup_logging
    from blobmount.settings import load_settings
    from blobmount.warm.report import summary_json, summary_lines

    settings = load_settings(anonymous=args.anonymous)
    setup_logging(settings.log_level, stderr=True)
    signals = _Signals()
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
                    anonymous=args.anonymous,
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
