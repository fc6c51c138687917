"""Command line: `blobmount mount|unmount|config`.

`mount` runs the daemon in the background by default and returns only once the mount answers
(or fails, with the daemon's reason). The source URI reaches the background daemon through its
environment, not its argv, so a SAS in the URI does not show in `ps`.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from blobmount import __version__
from blobmount.errors import BlobmountError

log = logging.getLogger(__name__)

SOURCE_ENV = "BLOBMOUNT_SOURCE_URI"
READY_TIMEOUT_S = 120.0


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
    mount.add_argument("uri", nargs="?", help="az://, https://, http:// (Azurite) or wasbs:// URI")
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

    from blobmount.download.command import add_download_parser

    add_download_parser(sub)
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
        if args.command == "stats":
            return _stats(args.mountpoint, as_json=args.json)
        if args.command == "download":
            from blobmount.download.command import run_download

            return run_download(args)
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
    from blobmount.settings import load_settings
    from blobmount.source import parse_source

    uri = args.uri or os.environ.get(SOURCE_ENV)
    if not uri:
        raise SourceError("no source URI given")
    # Cheap checks first, in the caller's terminal: bad settings or a malformed URI stop here.
    settings = load_settings(**_overrides(args))
    spec = parse_source(uri)
    mountpoint = args.mountpoint.absolute()
    if args.foreground:
        return _run_foreground(spec, mountpoint, settings, args)
    return _spawn_daemon(uri, mountpoint, settings, args)


def _run_foreground(spec: Any, mountpoint: Path, settings: Any, args: argparse.Namespace) -> int:
    from blobmount.daemon import MountRequest, run
    from blobmount.logs import setup_logging
    from blobmount.readiness import ReadyNotifier

    log_file = args.log_file or settings.log_file
    daemonized = os.environ.get("BLOBMOUNT_DAEMONIZED") == "1"
    setup_logging(settings.log_level, log_file=log_file, stderr=not daemonized)
    request = MountRequest(spec, mountpoint, settings, args.allow_non_empty, log_file)
    return run(request, ReadyNotifier())


def _spawn_daemon(uri: str, mountpoint: Path, settings: Any, args: argparse.Namespace) -> int:
    from blobmount.readiness import READY_FD_ENV
    from blobmount.runstate import default_log_file

    log_file = (args.log_file or settings.log_file or default_log_file(mountpoint)).absolute()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    read_fd, write_fd = os.pipe()
    env = dict(os.environ)
    env[SOURCE_ENV] = uri
    env[READY_FD_ENV] = str(write_fd)
    env["BLOBMOUNT_DAEMONIZED"] = "1"
    for name, value in _overrides(args).items():
        from blobmount.settings import ENV_VARS

        env[ENV_VARS[name]] = str(value).lower() if isinstance(value, bool) else str(value)
    cmd = [sys.executable, "-m", "blobmount", "mount", "--foreground", "--log-file", str(log_file)]
    if args.allow_non_empty:
        cmd.append("--allow-non-empty")
    cmd.append(str(mountpoint))
    with open(log_file, "ab") as log_out:
        child = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_out,
            stderr=log_out,
            pass_fds=(write_fd,),
            start_new_session=True,
        )
    os.close(write_fd)
    message = _wait_for_daemon(read_fd, child)
    os.close(read_fd)
    if message.startswith("ready"):
        print(f"blobmount: {message[6:]} (pid {child.pid}, log {log_file})")
        return 0
    if message.startswith("error"):
        print(f"blobmount: {message[6:]}", file=sys.stderr)
    else:
        print(f"blobmount: {message}; see the log {log_file}", file=sys.stderr)
    if child.poll() is None:
        child.terminate()
    return 1


def _wait_for_daemon(read_fd: int, child: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + READY_TIMEOUT_S
    data = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([read_fd], [], [], 0.5)
        if ready:
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            data += chunk
            if data.endswith(b"\n"):
                return data.decode(errors="replace").strip()
    if data:
        return data.decode(errors="replace").strip()
    status = child.poll()
    if status is not None:
        return f"the daemon exited (status {status}) before the mount was ready"
    return f"the mount was not ready after {READY_TIMEOUT_S:.0f}s"


def _unmount(mountpoint: Path) -> int:
    from blobmount.mountpoint import mount_type, unmount_fuse
    from blobmount.runstate import MountRecord, pid_alive
    from blobmount.settings import load_settings

    mountpoint = mountpoint.absolute()
    timeout_s = load_settings().unmount_timeout_s
    record = MountRecord.load(mountpoint)
    if record is not None and pid_alive(record.pid):
        # The daemon finishes requests in flight (up to the timeout), then unmounts itself.
        os.kill(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s + 10
        while time.monotonic() < deadline and pid_alive(record.pid):
            time.sleep(0.05)
        if not pid_alive(record.pid):
            print(f"blobmount: unmounted {mountpoint}")
            return 0
        print(f"blobmount: daemon {record.pid} did not stop in time; forcing", file=sys.stderr)
        os.kill(record.pid, signal.SIGKILL)
    if mount_type(mountpoint) is None:
        print(f"blobmount: {mountpoint} is not mounted", file=sys.stderr)
        return 1
    if unmount_fuse(mountpoint) or unmount_fuse(mountpoint, lazy=True):
        print(f"blobmount: unmounted {mountpoint}")
        return 0
    print(f"blobmount: could not unmount {mountpoint}", file=sys.stderr)
    return 1
