"""Where a snapshot is kept: a local file, read and written here, or a blob (anything with
``://``), which the composition layer reads and writes through the storage stack.

A local snapshot is written to a temporary name in the same folder, flushed to disk, and renamed
over the target, so a reader (another node on a shared volume, a pod starting early) sees the
old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
from pathlib import Path

from blobmount.snapshots.format import SnapshotError

log = logging.getLogger(__name__)

_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def is_blob_ref(ref: str) -> bool:
    """Whether a snapshot reference is a URI (a blob) rather than a local path."""
    return _URI.match(ref.strip()) is not None


def local_path(ref: str) -> Path:
    """The path a local snapshot reference names (`~` expanded)."""
    return Path(os.path.expanduser(ref.strip()))


def read_local(path: Path) -> bytes:
    """The bytes of a local snapshot file.

    Raises:
        SnapshotError: it cannot be read (missing, a folder, no permission).
    """
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SnapshotError(
            f"cannot read the snapshot {path}: {exc.strerror or type(exc).__name__}"
        ) from None


def write_local(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically (temporary name, fsync, rename, fsync of the folder).

    Raises:
        SnapshotError: the folder is missing or not writable, or the disk is full.
    """
    folder = path.parent
    temporary = folder / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise SnapshotError(
            f"cannot write the snapshot {path}: {exc.strerror or type(exc).__name__}"
        ) from None
    # the rename itself survives a crash only once the folder is on disk too
    with contextlib.suppress(OSError):
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
