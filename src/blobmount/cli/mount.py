"""`blobmount mount URI MOUNTPOINT`: mount in the background, or with --foreground run the daemon.

In the background (the default) the command returns only once the mount answers, or fails
with the daemon's reason: spawning and the readiness wait are `blobmount.launch`, shared with
the Python API. The background daemon is this command with --foreground; it gets the source URI
from its environment, not its argv, so a SAS in the URI does not show in `ps`.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from pathlib import Path
from typing import Any

from blobmount.cli.verbosity import add_flags as add_verbosity_flags
from blobmount.cli.verbosity import log_level
from blobmount.errors import BlobmountError, MountPointError, SourceError
from blobmount.launch import (
    SOURCE_ENV,
    check_log_file,
    check_mount_request,
    log_file_origin,
    pyfuse3_import_problem,
    start_mount,
)
from blobmount.logs import setup_logging
from blobmount.readiness import ReadyNotifier

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    mount = sub.add_parser(
        "mount",
        help="mount a container or prefix",
        description="Mount URI at MOUNTPOINT. Settings come from DATASET_MOUNT_* variables "
        "(see `blobmount config`); flags override them.",
    )
    mount.add_argument(
        "uri", nargs="?", help="az://, https://, http:// (Azurite), wasbs:// or azureml:// URI"
    )
    # text, not Path: Path("az://c/p") would hide that a URI was given where a folder belongs
    mount.add_argument("mountpoint", help="an existing empty folder")
    mount.add_argument(
        "-f",
        "--foreground",
        action="store_true",
        help="stay attached (for systemd and containers); log to stderr",
    )
    mount.add_argument("--log-file", type=Path, help="daemon log file (default: printed)")
    add_verbosity_flags(mount, command=True)
    mount.add_argument(
        "--allow-other",
        action="store_true",
        default=None,
        help="let other users read the mount (needs user_allow_other for non-root)",
    )
    mount.add_argument(
        "--allow-non-empty", action="store_true", help="mount over a folder that is not empty"
    )
    mount.add_argument("--uid", type=int, help="owner of files in the mount")
    mount.add_argument("--gid", type=int, help="group of files in the mount")
    mount.add_argument("--file-mode", help="permission bits of files, octal (default 0444)")
    mount.add_argument("--dir-mode", help="permission bits of folders, octal (default 0555)")
    mount.add_argument(
        "--anonymous", action="store_true", default=None, help="no credentials (public containers)"
    )
    mount.add_argument(
        "--snapshot",
        metavar="SNAPSHOT_URI",
        help="take the namespace from this snapshot (no listing; reads pinned to its versions)",
    )


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given, as settings overrides."""
    out: dict[str, Any] = {}
    for flag in ("allow_other", "uid", "gid", "anonymous", "file_mode", "dir_mode", "snapshot"):
        value = getattr(args, flag, None)
        if value is not None:
            out[flag] = value
    level = log_level(args)  # -v / --debug
    if level is not None:
        out["log_level"] = level
    return out


#: what a URI looks like (a scheme, then "://"), to tell one from a mount point
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")

_USAGE = "usage: blobmount mount URI MOUNTPOINT"


def _uri_and_mountpoint(args: argparse.Namespace) -> tuple[str, Path]:
    """The source URI and the mount point, or a usage error naming the one missing.

    With a single argument argparse fills MOUNTPOINT (URI is optional, for the daemon and
    systemd units, which pass the URI in BLOBMOUNT_SOURCE_URI)."""
    if args.uri is None and _URI.match(args.mountpoint):
        # never echo the argument: a URI can carry a SAS
        raise MountPointError(f"no mount point given: the one argument is a source URI; {_USAGE}")
    uri = args.uri or os.environ.get(SOURCE_ENV)
    if not uri:
        raise SourceError(f"no source URI given; {_USAGE} (or set {SOURCE_ENV})")
    return uri, Path(args.mountpoint)


def run(args: argparse.Namespace) -> int:
    uri, mountpoint = _uri_and_mountpoint(args)
    if args.foreground:
        return _run_foreground(uri, mountpoint, args)
    given = {**overrides(args), "log_file": args.log_file}
    running = start_mount(uri, mountpoint, overrides=given, allow_non_empty=args.allow_non_empty)
    print(f"blobmount: {running.status} (pid {running.pid}, log {running.log_file})")
    return 0


def _run_foreground(uri: str, mountpoint: Path, args: argparse.Namespace) -> int:
    notifier = ReadyNotifier()
    try:
        # Cheap checks first: bad settings or a malformed URI stop here.
        settings, spec = check_mount_request(uri, overrides(args))
        log_file = args.log_file or settings.log_file
        if log_file is not None:
            check_log_file(log_file.absolute(), log_file_origin(args.log_file is not None))
    except BlobmountError as exc:
        notifier.error(str(exc))  # a background parent checked already; tell it anyway
        raise

    daemonized = os.environ.get("BLOBMOUNT_DAEMONIZED") == "1"
    setup_logging(
        settings.log_level,
        log_file=log_file,
        stderr=not daemonized,
        log_format=settings.log_format,
    )
    try:
        # lazy: the daemon imports pyfuse3 (and libfuse3 under it), needed by this path only
        from blobmount.daemon import MountRequest
        from blobmount.daemon_processes import run
    except ImportError as exc:
        if exc.name != "pyfuse3" and "fuse" not in str(exc):
            raise
        # pyfuse3 is installed but libfuse3 is not: say what to install, not a traceback
        message = pyfuse3_import_problem(exc)
        log.error("%s", message)
        notifier.error(message)
        return 1
    return run(
        MountRequest(spec, mountpoint.absolute(), settings, args.allow_non_empty, log_file),
        notifier,
    )
