"""Command line: `blobmount mount|unmount|config|stats|datastores|download`.

`mount` runs the daemon in the background by default and returns only once the mount answers
(or fails, with the daemon's reason). The source URI reaches the background daemon through its
environment, not its argv, so a SAS in the URI does not show in `ps`. Spawning, the readiness
wait and unmounting live in `blobmount.api`, shared with the Python API.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from blobmount import __version__
from blobmount.errors import BlobmountError

log = logging.getLogger(__name__)

#: = blobmount.api.SOURCE_ENV, repeated so that `--help` does not import the API module
SOURCE_ENV = "BLOBMOUNT_SOURCE_URI"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="blobmount",
        description="Mount an Azure Blob container (or a prefix of it) as a read-only folder.",
    )
    parser.add_argument("--version", action="version", version=f"blobmount {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    mount = sub.add_parser(
        "mount",
        help="mount a container or prefix",
        description="Mount URI at MOUNTPOINT. Settings come from DATASET_MOUNT_* variables "
        "(see `blobmount config`); flags override them.",
    )
    mount.add_argument(
        "uri", nargs="?", help="az://, https://, http:// (Azurite), wasbs:// or azureml:// URI"
    )
    mount.add_argument("mountpoint", type=Path)
    mount.add_argument(
        "-f",
        "--foreground",
        action="store_true",
        help="stay attached (for systemd and containers); log to stderr",
    )
    mount.add_argument("--log-file", type=Path, help="daemon log file (default: printed)")
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

    unmount = sub.add_parser("unmount", help="unmount gracefully")
    unmount.add_argument("mountpoint", type=Path)

    stats = sub.add_parser("stats", help="show a live mount's statistics")
    stats.add_argument("mountpoint", type=Path)
    stats.add_argument("--json", action="store_true", help="machine-readable output")

    sub.add_parser("config", help="print the effective settings")

    datastores = sub.add_parser(
        "datastores",
        help="list the datastores that azureml:// URIs can name",
        description="List the datastores file's entries (DATASET_MOUNT_DATASTORES_FILE, else "
        "$XDG_CONFIG_HOME/blobmount/datastores.toml): name, account, container, endpoint and "
        "the kind of credential. Secrets are never shown.",
    )
    datastores.add_argument("--json", action="store_true", help="machine-readable output")

    from blobmount.cli.download import add_download_parser

    add_download_parser(sub)
    from blobmount.cli.cache import add_cache_parser

    add_cache_parser(sub)
    from blobmount.cli.warm import add_warm_parser

    add_warm_parser(sub)
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """CLI flags as settings overrides (only the ones given)."""
    out: dict[str, Any] = {}
    for flag in ("allow_other", "uid", "gid", "anonymous"):
        value = getattr(args, flag, None)
        if value is not None:
            out[flag] = value
    for flag in ("file_mode", "dir_mode"):
        value = getattr(args, flag, None)
        if value is not None:
            out[flag] = value
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "mount":
            return _mount(args)
        if args.command == "unmount":
            return _unmount(args.mountpoint)
        if args.command == "config":
            return _config()
        if args.command == "datastores":
            return _datastores(as_json=args.json)
        if args.command == "stats":
            return _stats(args.mountpoint, as_json=args.json)
        if args.command == "download":
            from blobmount.cli.download import run_download

            return run_download(args)
        if args.command == "cache":
            from blobmount.cli.cache import run_cache

            return run_cache(args)
        if args.command == "warm":
            from blobmount.cli.warm import run_warm

            return run_warm(args)
    except BlobmountError as exc:
        print(f"blobmount: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 2


def _config() -> int:
    from blobmount.settings import describe, load_settings

    settings = load_settings()
    rows = describe(settings)
    width = max(len(name) for name, _, _ in rows)
    for name, value, source in rows:
        print(f"{name:<{width}}  {value:<16} ({source})")
    return 0


def _stats(mountpoint: Path, *, as_json: bool) -> int:
    import json

    from blobmount.runstate import stats_socket
    from blobmount.stats import fetch_stats, format_stats

    try:
        snapshot = fetch_stats(stats_socket(mountpoint.absolute()))
    except OSError as exc:
        print(f"blobmount: no live mount at {mountpoint} ({exc.strerror or exc})", file=sys.stderr)
        return 1
    print(json.dumps(snapshot, indent=2) if as_json else format_stats(snapshot))
    return 0


def _mount(args: argparse.Namespace) -> int:
    from blobmount.errors import SourceError

    uri = args.uri or os.environ.get(SOURCE_ENV)
    if not uri:
        raise SourceError("no source URI given")
    if args.foreground:
        return _run_foreground(uri, args)
    from blobmount.api import start_mount

    overrides = {**_overrides(args), "log_file": args.log_file}
    running = start_mount(
        uri, args.mountpoint, overrides=overrides, allow_non_empty=args.allow_non_empty
    )
    print(f"blobmount: {running.status} (pid {running.pid}, log {running.log_file})")
    return 0


def _run_foreground(uri: str, args: argparse.Namespace) -> int:
    from blobmount.api import FuseUnavailable, fuse_problem, pyfuse3_import_problem
    from blobmount.datastores import resolve_source
    from blobmount.readiness import ReadyNotifier
    from blobmount.settings import load_settings

    notifier = ReadyNotifier()
    try:
        # Cheap checks first: bad settings or a malformed URI stop here.
        settings = load_settings(**_overrides(args))
        spec = resolve_source(uri)
        problem = fuse_problem()
        if problem is not None:
            raise FuseUnavailable(problem)
    except BlobmountError as exc:
        notifier.error(str(exc))  # a background parent checked already; tell it anyway
        raise

    from blobmount.daemon import MountRequest, run
    from blobmount.logs import setup_logging

    log_file = args.log_file or settings.log_file
    daemonized = os.environ.get("BLOBMOUNT_DAEMONIZED") == "1"
    setup_logging(
        settings.log_level,
        log_file=log_file,
        stderr=not daemonized,
        log_format=settings.log_format,
    )
    mountpoint = args.mountpoint.absolute()
    request = MountRequest(spec, mountpoint, settings, args.allow_non_empty, log_file)
    try:
        return run(request, notifier)
    except ImportError as exc:
        if exc.name != "pyfuse3" and "fuse" not in str(exc):
            raise
        # pyfuse3 is installed but libfuse3 is not: say what to install, not a traceback
        message = pyfuse3_import_problem(exc)
        log.error("%s", message)
        notifier.error(message)
        return 1


def _datastores(*, as_json: bool) -> int:
    import json

    from blobmount.datastores import load_datastores

    found = load_datastores()
    if as_json:
        rows = [
            {
                "name": d.name,
                "workspace": d.workspace,
                "account": d.account,
                "container": d.container,
                "endpoint": d.endpoint,
                "credential": d.credential.kind,
                "credential_source": d.credential.label,
            }
            for d in found.datastores
        ]
        print(json.dumps({"file": str(found.path), "datastores": rows}, indent=2))
        return 0
    print(f"datastores file: {found.path}")
    if not found.datastores:
        print("(no datastores defined)")
        return 0
    table = [("NAME", "ACCOUNT", "CONTAINER", "ENDPOINT", "CREDENTIAL")]
    for d in found.datastores:
        endpoint = d.endpoint or "(default)"
        table.append((d.qualified_name, d.account, d.container, endpoint, d.credential.label))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]))
    return 0


def _unmount(mountpoint: Path) -> int:
    from blobmount.api import unmount

    unmount(mountpoint)
    print(f"blobmount: unmounted {mountpoint.absolute()}")
    return 0
