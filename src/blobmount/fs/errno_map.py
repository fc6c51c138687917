"""The one table from blobmount errors to errno values (and how loudly to log them)."""

from __future__ import annotations

import errno
import logging

from blobmount.errors import (
    BlobChanged,
    BlobNotFound,
    ContainerNotFound,
    CredentialError,
    StorageError,
    StorageUnavailable,
)


class FsError(Exception):
    """A filesystem-level refusal with its errno (ENOENT, EROFS, EISDIR, ...)."""

    def __init__(self, errno_value: int, message: str = "") -> None:
        super().__init__(message or errno.errorcode.get(errno_value, str(errno_value)))
        self.errno = errno_value


# order matters: the first matching class wins
_TABLE: tuple[tuple[type[BaseException], int, int], ...] = (
    (BlobNotFound, errno.ENOENT, logging.INFO),
    (BlobChanged, errno.EIO, logging.WARNING),
    (CredentialError, errno.EACCES, logging.ERROR),
    (ContainerNotFound, errno.EIO, logging.ERROR),
    (StorageUnavailable, errno.EIO, logging.WARNING),
    (StorageError, errno.EIO, logging.WARNING),
)


def errno_for(exc: BaseException) -> tuple[int, int]:
    """(errno, log level) for an exception raised by the filesystem layer."""
    if isinstance(exc, FsError):
        return exc.errno, logging.DEBUG
    for cls, value, level in _TABLE:
        if isinstance(exc, cls):
            return value, level
    return errno.EIO, logging.ERROR
