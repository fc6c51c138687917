"""The Python API: mount a source for the length of a ``with`` block, download one, unmount.

::

    import blobmount

    with blobmount.mount("azureml://datastores/training/paths/imagenet",
                         read_buffer_block_count=80, memory_cache_size="0") as data:
        train(data / "train")          # an ordinary folder while the block runs
    # unmounted here, also when train() raised

    blobmount.download("az://datasets/mnist", "/tmp/mnist")

    from blobmount.api import create_snapshot
    create_snapshot("az://datasets/imagenet", "az://datasets/snapshots/imagenet.bmsnap")
    with blobmount.mount("az://datasets/imagenet",
                         snapshot="az://datasets/snapshots/imagenet.bmsnap") as data:
        ...                            # the recorded version, on every node, without listing

This is the command line's own code path, not a second one: mounting is `blobmount.launch` (which
validates the settings and the URI, spawns the same background daemon and waits on the same
readiness pipe), downloading is `blobmount.compose.download`, both also used by `blobmount.cli`.

Settings are keyword arguments named like the fields of `blobmount.settings.Settings`
(``read_block_size="8MB"``, ``read_buffer_block_count=80``); anything not given comes from the
``DATASET_MOUNT_*`` variables, and credentials come from the environment as for the CLI.
Importing this module does not need FUSE; `mount` says what to install when FUSE is missing.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import trio

from blobmount.compose.download import download_config, run_download
from blobmount.compose.snapshots import CreatedSnapshot, SnapshotInfo
from blobmount.compose.snapshots import create_snapshot as _create_snapshot
from blobmount.compose.snapshots import diff_snapshots as _diff_snapshots
from blobmount.compose.snapshots import snapshot_info as _snapshot_info
from blobmount.datastores import resolve_source
from blobmount.download_mode.downloader import DownloadResult
from blobmount.errors import BlobmountError, MountPointError
from blobmount.launch import (
    FuseUnavailable,
    MountFailed,
    PathArg,
    RunningMount,
    fuse_problem,
    mount,
    start_mount,
    unmount,
)
from blobmount.runstate import stats_socket
from blobmount.settings import load_settings
from blobmount.snapshot import MountSnapshot
from blobmount.snapshots.diff import SnapshotDiff
from blobmount.stats import fetch_snapshot

__all__ = [
    "CreatedSnapshot",
    "DownloadFailed",
    "FuseUnavailable",
    "MountFailed",
    "RunningMount",
    "SnapshotDiff",
    "SnapshotInfo",
    "create_snapshot",
    "diff_snapshots",
    "download",
    "fuse_problem",
    "mount",
    "mount_stats",
    "snapshot_info",
    "start_mount",
    "unmount",
]

log = logging.getLogger(__name__)


class DownloadFailed(BlobmountError):
    """Some blobs were not copied; `result` says which and why."""

    def __init__(self, message: str, result: DownloadResult) -> None:
        super().__init__(message)
        self.result = result


def download(
    uri: str,
    dest: PathArg,
    *,
    include: tuple[str, ...] | list[str] = (),
    exclude: tuple[str, ...] | list[str] = (),
    verify: bool = False,
    progress: bool = False,
    page_cache: bool = False,
    **settings: Any,
) -> DownloadResult:
    """Copy every blob under `uri` to the folder `dest` (created if missing), as
    ``blobmount download`` does; a rerun skips files already current.

    `include`/`exclude` are the command's --include/--exclude globs, `verify` its --verify,
    `page_cache` its --page-cache (write every file through the page cache).
    `settings` are named like the fields of `blobmount.settings.Settings`
    (``downloader_threads=32``).

    Raises:
        TypeError: a keyword names no setting.
        ConfigError, SourceError, CredentialError: see `start_mount`.
        StorageError: the download could not start (missing container, refused credentials).
        DownloadFailed: some blobs were not copied; its `result` lists them.
        KeyboardInterrupt: stopped by Ctrl-C or SIGTERM; completed files are kept.
    """
    loaded = load_settings(**settings)
    spec = resolve_source(uri)
    config = download_config(
        loaded,
        spec,
        Path(dest).expanduser(),
        verify=verify,
        direct_io=not page_cache,
        includes=tuple(include),
        excludes=tuple(exclude),
    )
    outcome = trio.run(run_download, loaded, spec, config, progress)
    if outcome.interrupted is not None:
        raise KeyboardInterrupt(outcome.interrupted)
    result = outcome.result
    if not result.ok:
        reason = result.fatal or f"{result.stats.failed} blob(s) were not copied"
        raise DownloadFailed(f"downloading {spec.display} to {config.dest}: {reason}", result)
    return result


def mount_stats(mountpoint: PathArg) -> MountSnapshot:
    """The live statistics of the mount at `mountpoint` (what `blobmount stats` shows), read
    by attribute: ``blobmount.mount_stats("/mnt/data").storage.range_bytes``.

    Raises:
        MountPointError: no blobmount mount answers at `mountpoint`.
        SnapshotFormatError: the daemon is a different blobmount version (names the figure).
    """
    try:
        return fetch_snapshot(stats_socket(Path(mountpoint).absolute()))
    except OSError as exc:
        raise MountPointError(f"no live mount at {mountpoint} ({exc.strerror or exc})") from None


def create_snapshot(uri: str, dest: PathArg, **settings: Any) -> CreatedSnapshot:
    """Record every blob under `uri` (one flat listing) and write the snapshot to `dest`, a
    local path or a blob URI in any source form, as ``blobmount snapshot create`` does. Mount
    it with ``blobmount.mount(uri, snapshot=dest)``; ``download`` takes ``snapshot=`` too.

    Raises:
        TypeError: a keyword names no setting.
        ConfigError, SourceError, CredentialError: see `start_mount`.
        StorageError: the source could not be listed, or the snapshot blob not written.
        SnapshotError: the snapshot could not be written there.
    """
    loaded = load_settings(**settings)
    return trio.run(_create_snapshot, loaded, resolve_source(uri), str(dest))


def snapshot_info(ref: PathArg, **settings: Any) -> SnapshotInfo:
    """The header of the snapshot at `ref` (source, time, entries, bytes), after checking that
    the file is whole (``blobmount snapshot show``).

    Raises:
        SnapshotError: not a snapshot, another format version, truncated or corrupt.
        StorageError: a snapshot blob that cannot be read.
    """
    return trio.run(_snapshot_info, load_settings(**settings), str(ref))


def diff_snapshots(old: PathArg, new: PathArg, **settings: Any) -> SnapshotDiff:
    """The blobs added, removed and changed from snapshot `old` to `new`
    (``blobmount snapshot diff``).

    Raises:
        SnapshotError, StorageError: as `snapshot_info`, for either.
    """
    return trio.run(_diff_snapshots, load_settings(**settings), str(old), str(new))
