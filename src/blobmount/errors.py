"""The exception tree of blobmount. Imports nothing from the package.

    BlobmountError
    ├── ConfigError            a setting has a bad value (names variable, value, what is allowed)
    ├── SourceError            a URI cannot be parsed or names no container
    ├── MountPointError        mount point missing, not a folder, not empty, already mounted
    └── StorageError           anything that went wrong talking to storage
        ├── CredentialError    storage refused our identity (401/403, bad key, expired SAS)
        ├── ContainerNotFound  the container does not exist
        ├── BlobNotFound       the blob does not exist (any more)
        ├── BlobChanged        the blob's ETag is not the one a handle was pinned to (412)
        └── StorageUnavailable transient: throttling, 5xx, resets, timeouts, short bodies
    ProcessFailed              another blobmount process (a mount's daemon) failed; carries
                               that process's exit status

Storage clients raise only these; the filesystem layer maps them to errno in one table
(`blobmount.fs.errno_map`), and the command line maps them to its exit status in one table
(`exit_status`, below). Messages never contain secrets.
"""

from __future__ import annotations

from enum import IntEnum


class BlobmountError(Exception):
    """Base of every error blobmount raises on purpose."""


class ConfigError(BlobmountError):
    """A setting is unparsable or out of range."""


class SourceError(BlobmountError):
    """A source URI is malformed or incomplete."""


class MountPointError(BlobmountError):
    """The mount point cannot be used."""


class StorageError(BlobmountError):
    """A storage request failed."""


class CredentialError(StorageError):
    """Storage refused the credentials (authentication or authorisation failure)."""


class ContainerNotFound(StorageError):
    """The container does not exist."""


class BlobNotFound(StorageError):
    """The blob does not exist."""


class BlobChanged(StorageError):
    """The blob no longer has the ETag the request was pinned to."""


class StorageUnavailable(StorageError):
    """A transient failure: worth retrying after a pause.

    `retry_after_s` carries the server's Retry-After hint when it sent one.
    """

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ProcessFailed(BlobmountError):
    """Another blobmount process failed; `exit_status` is its exit status, so a front end that
    reports the failure can exit the way that process did."""

    def __init__(self, message: str, exit_status: int | None) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class ExitStatus(IntEnum):
    """The exit statuses of `blobmount` (documented in README.md and docs/INSTALL-SYSTEMD.md)."""

    OK = 0
    FAILED = 1  # anything not below, a bug included
    USAGE = 2  # bad command line, setting, URI or mount point: retrying cannot help
    CREDENTIALS = 3  # storage refused the credentials, or none could be had
    STORAGE = 4  # storage not reachable, or the container or blob not found


#: the one table from error class to exit status; the first class an error is an instance of
#: wins, so subclasses come before their bases
_STATUS_OF: tuple[tuple[type[BlobmountError], ExitStatus], ...] = (
    (ConfigError, ExitStatus.USAGE),
    (SourceError, ExitStatus.USAGE),
    (MountPointError, ExitStatus.USAGE),
    (CredentialError, ExitStatus.CREDENTIALS),
    (ContainerNotFound, ExitStatus.STORAGE),
    (BlobNotFound, ExitStatus.STORAGE),
    (StorageUnavailable, ExitStatus.STORAGE),
)


def exit_status(exc: BaseException) -> ExitStatus:
    """The exit status that reports `exc`: see `ExitStatus`. A `ProcessFailed` reports the
    failed process's own status when it is one of ours (FAILED when it was killed)."""
    if isinstance(exc, ProcessFailed):
        # a status that is not ours (killed by a signal, a crash) or 0 (yet failed) is FAILED
        known = {int(status) for status in ExitStatus} - {ExitStatus.OK}
        if exc.exit_status in known:
            return ExitStatus(exc.exit_status)
        return ExitStatus.FAILED
    for cls, status in _STATUS_OF:
        if isinstance(exc, cls):
            return status
    return ExitStatus.FAILED
