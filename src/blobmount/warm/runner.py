"""Running a warm-up: on a live mount, or on a URI mounted for the occasion.

On a mount point, the files are read through the live mount while its stats socket is watched.
On a URI, the source is first mounted on a private temporary folder through the same code path
as ``blobmount mount`` (`blobmount.launch.mount`, so the same DATASET_MOUNT_* settings apply),
warmed, and unmounted, also after a failure or a signal. Signals that arrive while that mount
starts or stops are held back until it has, so a Ctrl-C never leaves a mount behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from blobmount.datastores import resolve_source
from blobmount.errors import BlobmountError
from blobmount.launch import mount
from blobmount.progress import logging_around
from blobmount.runstate import stats_socket
from blobmount.snapshot import MountSnapshot
from blobmount.stats import fetch_snapshot
from blobmount.warm.report import BarReporter, make_reporter
from blobmount.warm.targets import WarmPathError, check_targets, resolve_targets
from blobmount.warm.warmer import Interrupted, Warmer, WarmResult

log = logging.getLogger(__name__)


class NotAMount(BlobmountError):
    """The first argument is neither a live mount nor a URI."""


# -- signals -----------------------------------------------------------------------------------


class Signals:
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


def live_mount(target: str) -> tuple[str, Path, MountSnapshot]:
    """(the daemon's mount point, its stats socket, a first snapshot) for `target`.

    Raises:
        NotAMount: nothing answers for `target`.
    """
    given = os.path.abspath(target)
    problem = "nothing answers on its stats socket"
    # the daemon knows its mount point as it was given: try the path as typed, then resolved
    for candidate in dict.fromkeys([given, os.path.realpath(given)]):
        socket_path = stats_socket(Path(candidate))
        try:
            snapshot = fetch_snapshot(socket_path)
        except (FileNotFoundError, ConnectionRefusedError):
            continue
        except OSError as exc:  # e.g. another user's mount: say so rather than "no mount"
            problem = f"its stats socket {socket_path}: {exc.strerror or exc}"
            continue
        return snapshot.mountpoint, socket_path, snapshot
    raise NotAMount(
        f"{target} is not a live blobmount mount ({problem}); to warm a source before "
        "mounting it, give its URI"
    )


def warm_mount(mountpoint: str, paths: Sequence[str], *, jobs: int, progress: bool) -> Warmed:
    """Warm PATHs of the live mount at `mountpoint`.

    Raises:
        NotAMount, WarmPathError, NoDiskCache, WarmAborted.
    """
    root, socket_path, snapshot = live_mount(mountpoint)
    targets = resolve_targets(root, paths)
    check_targets(root, targets)
    reporter = make_reporter(progress)
    warmer = Warmer(
        root, targets, lambda: fetch_snapshot(socket_path), jobs=jobs, progress=reporter
    )
    log.info("warming %s (%s mode, %d files at once)", root, warmer.result.mode, warmer.jobs)
    try:
        with logging_around(isinstance(reporter, BarReporter)):
            result = warmer.run()
    finally:
        if reporter is not None:
            reporter.close()
    return Warmed(result, root, snapshot.source)


def warm_uri(
    uri: str,
    paths: Sequence[str],
    signals: Signals,
    *,
    jobs: int,
    progress: bool,
    overrides: Mapping[str, Any] | None = None,
) -> Warmed:
    """Mount `uri` on a temporary folder, warm PATHs (relative to its root), unmount.

    `overrides` are settings by field name for that mount (as `blobmount.launch.mount` takes
    them), winning over the DATASET_MOUNT_* variables.
    """
    absolute = [p for p in paths if os.path.isabs(p)]
    if absolute:
        raise WarmPathError(f"with a URI, PATHs are relative to its root, not {absolute[0]}")
    with contextlib.ExitStack() as stack:
        with signals.holding_back():
            root = stack.enter_context(mount(uri, **(overrides or {})))
        stack.callback(signals.hold)  # runs first on the way out: unmounting is not cut short
        signals.raise_held()
        log.info("mounted %s at %s for warming", resolve_source(uri).display, root)
        return warm_mount(str(root), paths, jobs=jobs, progress=progress)
