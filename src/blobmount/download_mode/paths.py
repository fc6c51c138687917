"""Blob names → relative local paths under the download's destination, or a refusal. Pure.

The name after the prefix must pass the mount's own rule (`namespace.names.path_segments`: no
empty, `.` or `..` segment, no leading '/', NUL, lone surrogate or segment over 255 bytes), so
joining the result to the destination can never point outside it, and download refuses exactly
the names a mount of the same prefix leaves out, with the same reason. On top of that rule, names
that would collide with the downloader's own state (`.blobmount-download*` at the top level) are
refused.
"""

from __future__ import annotations

import logging

from blobmount.namespace.names import UnsafeName, path_segments

log = logging.getLogger(__name__)

#: top-level names the downloader keeps for itself (manifest, its journal, the temp folder)
RESERVED_PREFIX = ".blobmount-download"


def local_path(name: str, prefix: str, *, is_dir: bool = False) -> str:
    """The '/'-separated path of blob `name` relative to the destination.

    `prefix` is the listed prefix ('' or ending in '/'); it is cut off. For folders (`is_dir`,
    see `namespace.names.is_folder_blob`) one trailing '/' is allowed, and '' (the destination
    itself) is a valid answer.

    Raises:
        UnsafeName: the name is outside the prefix, fails `path_segments`, or is a reserved
            top-level name.
    """
    if not name.startswith(prefix):
        raise UnsafeName("not under the prefix")
    segments = path_segments(name[len(prefix) :], is_dir=is_dir)
    if segments and segments[0].startswith(RESERVED_PREFIX):
        raise UnsafeName(f"{RESERVED_PREFIX}* is reserved for the downloader's own state")
    return "/".join(segments)
