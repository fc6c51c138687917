"""Checks and cleanup of a mount point before mounting, and unmount helpers."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
from pathlib import Path

from blobmount.errors import MountPointError

log = logging.getLogger(__name__)


#: what a FUSE mount whose daemon died answers ("Transport endpoint is not connected"), or
#: whose connection was aborted through /sys/fs/fuse/connections
_DEAD = frozenset({errno.ENOTCONN, errno.ECONNABORTED})


def _unescape(field: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as octal
    return (
        field.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
    )


def mount_type(path: Path) -> str | None:
    """The filesystem type mounted exactly at `path`, or None."""
    target = os.path.abspath(path)
    found = None
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) >= 3 and _unescape(fields[1]) == target:
                    found = fields[2]  # the last one wins: it is the one on top
    except OSError:
        return None
    return found


def fusermount() -> str:
    for name in ("fusermount3", "fusermount"):
        found = shutil.which(name)
        if found:
            return found
    raise MountPointError("fusermount3 not found: install the fuse3 package")


def unmount_fuse(path: Path, *, lazy: bool = False) -> bool:
    """Unmount a FUSE mount; True on success."""
    args = [fusermount(), "-u", "-q"] + (["-z"] if lazy else []) + [str(path)]
    return subprocess.run(args, capture_output=True, check=False).returncode == 0


def prepare_mountpoint(path: Path, *, allow_non_empty: bool = False) -> None:
    """Make sure `path` can be mounted on; clean up a mount left dead by a killed daemon.

    Raises MountPointError with a message that says what is wrong.
    """
    try:
        os.stat(path)
        if (mount_type(path) or "").startswith("fuse"):
            # The kernel answers stat from its attribute cache even when the daemon is gone
            # (for a year with the TTL unset); statfs always asks the daemon.
            os.statvfs(path)
    except FileNotFoundError:
        raise MountPointError(f"mount point {path} does not exist (create it first)") from None
    except OSError as exc:
        if exc.errno not in _DEAD:
            raise MountPointError(f"mount point {path} cannot be used: {exc.strerror}") from None
        # "Transport endpoint is not connected": a FUSE daemon died without unmounting.
        log.warning("mount point %s was left by a dead FUSE daemon; unmounting it", path)
        if not unmount_fuse(path, lazy=True):
            raise MountPointError(
                f"mount point {path} is a dead FUSE mount that could not be unmounted; "
                f"run: fusermount3 -u -z {path}"
            ) from None
    if not path.is_dir():
        raise MountPointError(f"mount point {path} is not a folder")
    kind = mount_type(path)
    if kind is not None and kind.startswith("fuse"):
        raise MountPointError(f"{path} is already a FUSE mount ({kind}); unmount it first")
    if not allow_non_empty and any(os.scandir(path)):
        raise MountPointError(
            f"mount point {path} is not empty (use --allow-non-empty to mount over it)"
        )
