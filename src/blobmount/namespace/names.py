"""Which blob-name segments can be POSIX file names. Pure."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

NAME_MAX = 255
_logged: set[str] = set()
_LOG_LIMIT = 10_000


def valid_segment(segment: str) -> bool:
    if segment in ("", ".", ".."):
        return False
    if "\0" in segment:
        return False
    return len(segment.encode("utf-8", "surrogatepass")) <= NAME_MAX


def note_skipped(blob_name: str, why: str) -> None:
    """Log a skipped blob name once (bounded, so a hostile listing cannot grow memory)."""
    if blob_name in _logged or len(_logged) >= _LOG_LIMIT:
        return
    _logged.add(blob_name)
    log.warning("skipping blob %r: %s", blob_name, why)
