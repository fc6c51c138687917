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

Storage clients raise only these; the filesystem layer maps them to errno in one table
(`blobmount.fs.errno_map`). Messages never contain secrets.
"""

from __future__ import annotations


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
