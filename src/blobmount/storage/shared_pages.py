"""SharedListPages: the list pages of a mount's processes, shared through a folder.

Each process of a multi-process mount lists a folder when it first needs it. Without sharing,
two processes list it at different times: without a TTL the view is then fixed per process, not
per mount (a folder that changed in between looks different depending on which process
answers, and one `readdir` whose requests land in both can repeat or miss an entry), and every
page is requested once per process.

So every page a process gets from storage is stored in the mount's shared folder (in memory:
/dev/shm) under a hash of the request, and a process that needs the same page reads it from
there. The first page stored for a request is the one every process uses: a process that
listed the same page at the same time and finds one stored already takes that one and drops its
own, so all processes build their listings from the same pages, and the continuation tokens in
them lead all of them to the same next pages. With a TTL a stored page serves for the TTL, after
which the next process to need it lists it again and replaces it.

Processes walking the same folders at the same time need the same pages at the same moment, so
a process about to list a page first claims it (a `.claim` file beside it, created exclusively,
holding its pid); a process that finds the page claimed waits for the claimer to store it
rather than sending the same request. It lists on its own if the claimer ends without a page
(its request failed), if the claimer's process is gone, or after `CLAIM_WAIT_S`.

A page is stored as plain tuples (a blob's fields in `BlobProps` order), not as the pickled
dataclasses: pickling a slots dataclass looks up its fields for every object, which made
storing and loading a page of 5,000 names several times dearer.

Storing is best effort: when the folder is full or unwritable the page is used unshared (and
that is logged once), as a process of a mount without this layer would.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import tempfile
import time
from collections.abc import Callable
from dataclasses import fields
from operator import attrgetter
from pathlib import Path
from typing import Any

from blobmount.claims import Claim, claimed_result, make_claim, release
from blobmount.storage.base import MAX_LIST_PAGE, BlobProps, ListPage, StorageClient
from blobmount.storage.wrapper import WrappingStorageClient

log = logging.getLogger(__name__)

#: the longest a process waits for another's claimed page before listing it itself
CLAIM_WAIT_S = 60.0


#: a blob as the tuple stored: its fields in declaration order, so `BlobProps(*row)` rebuilds it
_blob_row = attrgetter(*(field.name for field in fields(BlobProps)))


class SharedListPages(WrappingStorageClient):
    """List pages from the shared `folder` when a process of the mount stored them (and they
    are younger than `ttl_s`, None: forever), else from `inner`, then stored for the others."""

    def __init__(
        self,
        inner: StorageClient,
        folder: Path,
        ttl_s: float | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(inner)
        self._folder = folder
        self._ttl_s = ttl_s
        self._clock = clock
        self._unshared_logged = False
        #: pages read from the folder instead of storage, and pages this process stored
        self.shared_hits = 0
        self.stored = 0

    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        continuation: str | None = None,
        max_results: int = MAX_LIST_PAGE,
    ) -> ListPage:
        request = repr((self.location, prefix, delimiter, continuation, max_results))
        path = self.page_path(request)
        page = self._load(path, request)
        if page is None:
            claim = _claim_path(path)
            mine = make_claim(claim)
            if mine is Claim.THEIRS:
                page = await claimed_result(
                    claim, lambda: self._load(path, request), CLAIM_WAIT_S, "a list page"
                )
            if page is None:
                try:
                    page = await self.inner.list_page(
                        prefix,
                        delimiter=delimiter,
                        continuation=continuation,
                        max_results=max_results,
                    )
                    return self._store(path, request, page)
                finally:
                    if mine is Claim.OURS:
                        release(claim)
        self.shared_hits += 1
        return page

    def page_path(self, request: str) -> Path:
        """Where the page answering `request` (the repr of its parameters) is stored."""
        return self._folder / hashlib.blake2b(request.encode(), digest_size=16).hexdigest()

    def _load(self, path: Path, request: str) -> ListPage | None:
        """The stored page at `path` if it answers `request` and is fresh, else None."""
        try:
            with open(path, "rb") as f:
                stored_request, stored_at, rows, prefixes, continuation = pickle.load(f)
        except FileNotFoundError:
            return None
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
            log.warning("a shared list page is unreadable (%s): listing again", exc)
            return None
        if stored_request != request:
            return None  # a hash collision: this request lists on its own
        if self._ttl_s is not None and self._clock() - stored_at >= self._ttl_s:
            return None
        return ListPage(tuple(BlobProps(*row) for row in rows), prefixes, continuation)

    def _store(self, path: Path, request: str, page: ListPage) -> ListPage:
        """Store `page` for the other processes; the page every process uses for `request`
        (another's, if one stored it first and it is still fresh)."""
        try:
            fd, temporary = tempfile.mkstemp(dir=self._folder, prefix=".page-")
        except OSError as exc:
            return self._unshared(page, exc)
        try:
            try:
                with os.fdopen(fd, "wb") as f:
                    pickle.dump(self._record(request, page), f, protocol=pickle.HIGHEST_PROTOCOL)
            except OSError as exc:
                return self._unshared(page, exc)
            try:
                os.link(temporary, path)  # first writer wins
            except FileExistsError:
                theirs = self._load(path, request)
                if theirs is not None:
                    return theirs
                os.replace(temporary, path)  # an expired page (or a collision's): ours now
            except OSError as exc:
                return self._unshared(page, exc)
            self.stored += 1
            return page
        finally:
            try:
                os.unlink(temporary)
            except FileNotFoundError:
                pass

    def _record(self, request: str, page: ListPage) -> tuple[Any, ...]:
        rows = [_blob_row(blob) for blob in page.blobs]
        return (request, self._clock(), rows, page.prefixes, page.continuation)

    def _unshared(self, page: ListPage, exc: OSError) -> ListPage:
        if not self._unshared_logged:
            self._unshared_logged = True
            log.warning(
                "list pages cannot be shared between the mount's processes (%s): each lists "
                "on its own, and without a TTL their views of a changing folder may differ",
                exc,
            )
        return page


def _claim_path(page: Path) -> Path:
    return page.with_name(page.name + ".claim")
