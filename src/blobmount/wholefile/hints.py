"""Hints in whole-file mode: a hinted file is downloaded into the whole-file cache ahead of its
open, so the open finds it there (one download per version, as for any open)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from blobmount.blocks.keys import BlobVersion
from blobmount.wholefile.cache import WholeFileCache

log = logging.getLogger(__name__)


class WholeFileHints:
    """The hint coordinator's `Prefetcher` for whole-file mode."""

    def __init__(self, cache: WholeFileCache, nursery: trio.Nursery) -> None:
        self._cache = cache
        self._nursery = nursery

    def fetch_hinted(
        self,
        version: BlobVersion,
        max_blocks: int,
        wanted: Callable[[], bool],
        landed: Callable[[bool], None],
    ) -> int | None:
        # the window bounds how many run at once; the cache's slots bound the GETs
        self._nursery.start_soon(self._download, version, landed)
        return 1

    async def _download(self, version: BlobVersion, landed: Callable[[bool], None]) -> None:
        try:
            copy = await self._cache.open(version)
        except Exception as exc:  # the job's own open will meet it and report it
            log.debug("hinted download of %s failed: %s", version.name, exc)
            landed(False)
            return
        if copy is not None:
            self._cache.release(copy)
        landed(copy is not None)

    def drop_hinted(self, version: BlobVersion) -> int:
        return 0  # a downloaded file stays in the cache, pruned like any other
