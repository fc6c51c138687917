"""The kernel's limit on a FUSE mount's background requests, raised through fusectl.

The kernel sends a FUSE filesystem its read-ahead as "background" requests and lets at most
`max_background` of them (12 by default) be outstanding per mount; past `congestion_threshold`
(9 by default) it stops reading ahead and reads only the page asked for. With a dozen readers of
small files the mount is congested all the time, so a third of 25 KB files were read a 4 KiB page
at a time, in 5-7 FUSE requests each instead of one (measured: 4,000 files, 16 readers, 2.3-2.7
reads per file; with the limit at 64, exactly one, and about 15% less daemon CPU per file, medians
of 7 runs each). Each request costs the daemon the same Python overhead, whatever its size.

The limit is part of the answer to the kernel's INIT, which pyfuse3 does not let us set, so the
daemon raises it just after INIT through fusectl (/sys/fs/fuse/connections/<id>/, root only),
mounting fusectl there first if nobody has (systemd does at boot; containers often do not).
Nothing here stats the mount point: from inside the daemon that would be a request to itself.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from blobmount.mounttable import MOUNTINFO, device_at, mounts

FUSECTL_ROOT = "/sys/fs/fuse/connections"


def connection_id(mountpoint: str, *, mountinfo: str = MOUNTINFO) -> str:
    """fusectl's name for the connection of the FUSE mount at `mountpoint`: its device's minor
    number. Raises LookupError if nothing is mounted there."""
    return device_at(mountpoint, mountinfo=mountinfo).split(":", 1)[1]


def ensure_fusectl(root: str | None = None, *, mountinfo: str = MOUNTINFO) -> bool:
    """Mount fusectl at `root` (FUSECTL_ROOT) unless the mount table has it there already. True
    if this call mounted it. Raises OSError if it cannot (not root, no such directory, no
    `mount`)."""
    root = root or FUSECTL_ROOT
    if any(m.mountpoint == root and m.fstype == "fusectl" for m in mounts(mountinfo)):
        return False
    try:
        done = subprocess.run(
            ["mount", "-t", "fusectl", "fusectl", root],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise OSError(f"cannot run mount: {exc}") from None
    if done.returncode != 0:
        raise OSError(f"mount -t fusectl failed: {done.stderr.strip() or done.returncode}")
    return True


def set_max_background(
    mountpoint: str, requests: int, *, mountinfo: str = MOUNTINFO, root: str | None = None
) -> str:
    """Let the kernel keep up to `requests` background requests outstanding on the FUSE mount
    at `mountpoint`, congested from three quarters of that (the kernel's own ratio). Returns the
    connection id. Raises LookupError (nothing mounted there) or OSError (no fusectl, not root).
    """
    conn = Path(root or FUSECTL_ROOT) / connection_id(mountpoint, mountinfo=mountinfo)
    # the maximum first: the kernel keeps the threshold at or below it
    (conn / "max_background").write_text(str(requests), encoding="ascii")
    (conn / "congestion_threshold").write_text(str(max(1, requests * 3 // 4)), encoding="ascii")
    return conn.name
