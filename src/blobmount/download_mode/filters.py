"""--include / --exclude glob filters over paths relative to the downloaded prefix. Pure.

Patterns use shell wildcards (`*`, `?`, `[abc]`) as in `fnmatch`, matched case-sensitively
against the whole relative path, where `*` also matches `/`: `train/*` takes everything under
`train/`. A pattern without a `/` is also tried against the last path segment, so `*.jpg`
matches JPEGs in every folder. A trailing `/` means "everything under this folder"; a leading
`/` is ignored (patterns are always relative to the prefix).

A path is kept when it matches at least one include (or no include is given) and no exclude.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from collections.abc import Sequence

log = logging.getLogger(__name__)


def _compile(pattern: str) -> tuple[re.Pattern[str], bool]:
    """The regex for `pattern` and whether it also applies to bare file names."""
    text = pattern.strip().lstrip("/")
    if not text:
        raise ValueError(f"empty filter pattern {pattern!r}")
    if text.endswith("/"):
        text += "*"
    return re.compile(fnmatch.translate(text)), "/" not in text


class NameFilter:
    """Decides which relative paths a download keeps (see the module docstring)."""

    def __init__(self, includes: Sequence[str] = (), excludes: Sequence[str] = ()) -> None:
        """Raises ValueError for an empty pattern."""
        self._includes = [_compile(p) for p in includes]
        self._excludes = [_compile(p) for p in excludes]

    @property
    def active(self) -> bool:
        return bool(self._includes or self._excludes)

    @staticmethod
    def _matches(rules: list[tuple[re.Pattern[str], bool]], rel: str) -> bool:
        base = rel.rpartition("/")[2]
        return any(
            regex.match(rel) is not None or (bare and regex.match(base) is not None)
            for regex, bare in rules
        )

    def keeps(self, rel: str) -> bool:
        if self._includes and not self._matches(self._includes, rel):
            return False
        return not self._matches(self._excludes, rel)
