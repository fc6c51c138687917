"""The one rule for turning a blob name into a POSIX path, and why a name fails it. Pure.

A blob name is just a string to Azure. The mount (listings, kernel lookups) and download both
split it on '/' and accept it only if every segment is an ordinary file name; a name that fails
is left out (the mount, logged once) or refused (download), with the same reason text.

The policy:
- A segment may not be empty (`a//b`, a leading or a trailing '/'), `.` or `..`, hold a NUL or a
  '/', be over NAME_MAX bytes in UTF-8, or hold a lone surrogate (text that is not valid
  Unicode has no UTF-8 bytes a file name could have; a kernel name whose bytes are not UTF-8
  arrives surrogate-escaped and fails the same way).
- Names are taken as they are: no Unicode normalization, so `é` (NFC) and `é` (NFD) are two
  different names, as they are to Azure and to Linux.
- A folder blob (an `hdi_isfolder` marker, or a zero-length blob whose name ends in '/') may end
  in one '/'; the folder at the root itself ('' after the prefix) is its own marker.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

NAME_MAX = 255
_logged: set[str] = set()
_LOG_LIMIT = 10_000

# why a name fails the rule (download prints these; the mount logs them)
EMPTY_NAME = "empty name"
ABSOLUTE = "absolute path (starts with '/')"
EMPTY_SEGMENT = "empty path segment ('//' or a trailing '/')"
NUL = "contains a NUL character"
SLASH = "contains a '/'"
NOT_UNICODE = "not valid Unicode (lone surrogate)"
TOO_LONG = f"a path segment longer than {NAME_MAX} bytes"


class UnsafeName(ValueError):
    """A blob name that cannot be a POSIX path; the message says why."""


def segment_problem(segment: str) -> str | None:
    """Why `segment` cannot be one POSIX file name, or None if it can. Called per kernel lookup
    and per listed name: cheap checks first, one encode."""
    if segment in ("", ".", ".."):
        return EMPTY_SEGMENT if segment == "" else f"a {segment!r} path segment"
    if "\0" in segment:
        return NUL
    if "/" in segment:
        return SLASH
    try:
        size = len(segment.encode("utf-8"))
    except UnicodeEncodeError:
        return NOT_UNICODE
    return TOO_LONG if size > NAME_MAX else None


def valid_segment(segment: str) -> bool:
    return segment_problem(segment) is None


def path_segments(rel: str, *, is_dir: bool = False) -> list[str]:
    """The segments of `rel`, a blob name with its prefix cut off; [] for the root folder.

    `is_dir`: the blob is a folder (see `is_folder_blob`), so one trailing '/' is allowed and ''
    is the root itself.

    Raises:
        UnsafeName: see the module docstring; the message is one of this module's reasons.
    """
    if is_dir and len(rel) > 1 and rel.endswith("/"):
        rel = rel[:-1]
    if rel == "":
        if is_dir:
            return []
        raise UnsafeName(EMPTY_NAME)
    if rel.startswith("/"):
        raise UnsafeName(ABSOLUTE)
    segments = rel.split("/")
    for segment in segments:
        why = segment_problem(segment)
        if why is not None:
            raise UnsafeName(why)
    return segments


def path_problem(rel: str, *, is_dir: bool = False) -> str | None:
    """Why `rel` (see `path_segments`) cannot be a path, or None if it can."""
    try:
        path_segments(rel, is_dir=is_dir)
    except UnsafeName as exc:
        return str(exc)
    return None


def is_folder_blob(name: str, size: int, is_dir_marker: bool) -> bool:
    """Whether a blob stands for a folder: an hdi_isfolder marker, or a zero-length blob whose
    name ends in '/' (how some tools mark folders)."""
    return is_dir_marker or (size == 0 and name.endswith("/"))


def note_skipped(blob_name: str, why: str) -> None:
    """Log a skipped blob name once (bounded, so a hostile listing cannot grow memory)."""
    if blob_name in _logged or len(_logged) >= _LOG_LIMIT:
        return
    _logged.add(blob_name)
    log.warning("skipping blob %r: %s", blob_name, why)
