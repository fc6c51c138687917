"""Blob names → relative local paths under the download's destination, or a refusal. Pure.

A blob name is just a string to Azure: it may hold `..` segments, empty segments (`a//b`), a
leading `/`, NUL characters or segments longer than a file name may be. `local_path` accepts a
name only when every segment of it (after the prefix) is an ordinary file name, so joining the
result to the destination can never point outside it. Names that would collide with the
downloader's own state (`.blobmount-download*` at the top level) are refused too.
"""

from __future__ import annotations

import logging

from blobmount.namespace.names import NAME_MAX

log = logging.getLogger(__name__)

#: top-level names the downloader keeps for itself (manifest, its journal, the temp folder)
RESERVED_PREFIX = ".blobmount-download"


class UnsafeName(ValueError):
    """A blob name that cannot be a path under the destination; the message says why."""


def is_folder_blob(name: str, size: int, is_dir_marker: bool) -> bool:
    """Whether a blob stands for a folder: an hdi_isfolder marker, or a zero-length blob whose
    name ends in '/' (how some tools mark folders)."""
    return is_dir_marker or (size == 0 and name.endswith("/"))


def local_path(name: str, prefix: str, *, is_dir: bool = False) -> str:
    """The '/'-separated path of blob `name` relative to the destination.

    `prefix` is the listed prefix ('' or ending in '/'); it is cut off. For folders (`is_dir`)
    one trailing '/' is allowed, and '' (the destination itself) is a valid answer.

    Raises:
        UnsafeName: the name is outside the prefix, empty, absolute, has an empty, '.' or '..'
            segment, a NUL, a segment over 255 bytes, text that is not valid Unicode, or a
            reserved top-level name.
    """
    if not name.startswith(prefix):
        raise UnsafeName("not under the prefix")
    rel = name[len(prefix) :]
    if is_dir and rel.endswith("/"):
        rel = rel[:-1]
    if rel == "":
        if is_dir:
            return ""
        raise UnsafeName("empty name")
    if "\0" in rel:
        raise UnsafeName("contains a NUL character")
    if rel.startswith("/"):
        raise UnsafeName("absolute path (starts with '/')")
    segments = rel.split("/")
    for segment in segments:
        _check_segment(segment)
    if segments[0].startswith(RESERVED_PREFIX):
        raise UnsafeName(f"{RESERVED_PREFIX}* is reserved for the downloader's own state")
    return rel


def _check_segment(segment: str) -> None:
    if segment == "":
        raise UnsafeName("empty path segment ('//' or a trailing '/')")
    if segment in (".", ".."):
        raise UnsafeName(f"a {segment!r} path segment")
    try:
        encoded = segment.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafeName("not valid Unicode (lone surrogate)") from None
    if len(encoded) > NAME_MAX:
        raise UnsafeName(f"a path segment longer than {NAME_MAX} bytes")
