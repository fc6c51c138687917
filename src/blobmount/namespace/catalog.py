"""ListingCatalog: which folder listings exist, how new ones are filled, and when they expire.

Listing modes (DATASET_MOUNT_LISTING_MODE):
- hierarchical: every folder is listed on its own (one request per 5,000 entries of that folder);
- flat: the first listing starts one flat walk of the whole mount, which fills every folder;
- auto (default): folders are listed on their own until a tree walk shows itself — a program
  opening a third subfolder of the same folder (os.walk, find, ls -R, a dataset scan) — and then
  the rest of that folder's subtree is filled by one flat walk.

Listings, walks and negative lookups expire after the attribute TTL (never, when it is unset). An
expired listing gives its nodes back to the inode table, which frees those the kernel forgot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import LRUCache

from blobmount.namespace.inodes import InodeTable
from blobmount.namespace.listing import DirListing, FlatWalk, PagedListing, WalkedListing
from blobmount.storage.base import StorageClient

log = logging.getLogger(__name__)

#: in auto mode, opening this many subfolders of one folder starts a flat walk of it
AUTO_WALK_AFTER = 3
#: remembered "no such name" answers; older ones are forgotten first
NEGATIVE_ENTRIES = 100_000
#: lookups of names in a folder nobody listed are answered by a properties request each; after
#: this many, the folder is listed instead (5,000 names per request: a dataset reading its files
#: by known paths costs a list page per 5,000 files instead of a HEAD per file)
PROBES_BEFORE_LISTING = 2


@dataclass(frozen=True, slots=True)
class CatalogStats:
    mode: str
    listings: int
    paged_pages: int
    walks: int
    walk_pages: int
    negative_entries: int


class ListingCatalog:
    def __init__(
        self,
        storage: StorageClient,
        table: InodeTable,
        root_prefix: str,
        mode: str,
        ttl_s: float | None,
        clock: Callable[[], float],
    ) -> None:
        if mode not in ("auto", "hierarchical", "flat"):
            raise ValueError(f"unknown listing mode {mode!r}")
        self._storage = storage
        self._table = table
        self._root = root_prefix
        self.mode = mode
        self._ttl_s = ttl_s
        self._clock = clock
        self._listings: dict[str, DirListing] = {}
        self._walks: dict[str, FlatWalk] = {}
        self._opened_children: dict[str, int] = {}
        self._probes: LRUCache[str, int] = LRUCache(maxsize=10_000)
        self._negative: LRUCache[str, float] = LRUCache(maxsize=NEGATIVE_ENTRIES)
        self._paged_pages_done = 0  # pages of listings already dropped
        self._walk_pages_done = 0
        self._walks_started = 0
        self._swept = clock()

    def fresh(self, since: float) -> bool:
        return self._ttl_s is None or self._clock() - since < self._ttl_s

    # -- listings --------------------------------------------------------------------------

    def get(self, prefix: str) -> DirListing | None:
        """The current listing of the folder with blob prefix `prefix`, if there is one."""
        listing = self._listings.get(prefix)
        if listing is not None and not self.fresh(listing.created):
            self._drop(prefix, listing)
            return None
        return listing

    def _drop(self, prefix: str, listing: DirListing) -> None:
        del self._listings[prefix]
        listing.detach()
        if isinstance(listing, PagedListing):
            self._paged_pages_done += listing.pages

    def _folder(self, prefix: str) -> str:
        """The folder's path below the mount root, from its blob prefix."""
        return prefix[len(self._root) : -1] if len(prefix) > len(self._root) else ""

    def for_folder(self, prefix: str, parent_prefix: str | None) -> DirListing:
        """The listing to read the folder from, starting one if needed."""
        listing = self.get(prefix)
        if listing is not None:
            return listing
        walk = self._covering_walk(prefix)
        if walk is not None:
            pass  # a walk under way already covers this folder (even an empty one)
        elif self.mode == "flat":
            walk = self._walk(self._root)
        elif self.mode == "auto" and parent_prefix is not None:
            opened = self._opened_children.get(parent_prefix, 0) + 1
            self._opened_children[parent_prefix] = opened
            if opened >= AUTO_WALK_AFTER and self.get(parent_prefix) is not None:
                del self._opened_children[parent_prefix]
                log.info("tree walk under %r: listing the rest of it flat", parent_prefix)
                walk = self._walk(parent_prefix)
        return self._start_listing(prefix, walk)

    def listing_for_lookups(self, prefix: str) -> DirListing | None:
        """A listing to answer lookups in the folder from, once lookups there have been
        frequent enough to be worth one (counted per call); None until then."""
        listing = self.get(prefix)
        if listing is not None:
            return listing
        probes = self._probes.get(prefix, 0) + 1
        self._probes[prefix] = probes
        if probes <= PROBES_BEFORE_LISTING:
            return None
        del self._probes[prefix]
        return self._start_listing(prefix, self._covering_walk(prefix))

    def _sweep(self) -> None:
        """Drop every expired listing, at most once per TTL: a folder nobody reads again gives
        its memory back too."""
        if self._ttl_s is None or self._clock() - self._swept < self._ttl_s:
            return
        self._swept = self._clock()
        for prefix, listing in list(self._listings.items()):
            if not self.fresh(listing.created):
                self._drop(prefix, listing)

    def _start_listing(self, prefix: str, walk: FlatWalk | None) -> DirListing:
        """A new listing of the folder: filled by `walk` when one covers it, else paged."""
        self._sweep()
        if walk is not None:
            walked = self._walked_listing(walk, prefix)
            if walked is not None:
                return walked
        paged = PagedListing(
            self._storage, self._table, prefix, self._folder(prefix), self._clock()
        )
        self._listings[prefix] = paged
        return paged

    def _covering_walk(self, prefix: str) -> FlatWalk | None:
        for walk_base, walk in self._walks.items():
            if prefix.startswith(walk_base) and self.fresh(walk.created):
                return walk
        return None

    def _walk(self, base: str) -> FlatWalk:
        """A fresh walk covering `base`: an existing one of it or of an ancestor, or a new one."""
        for walk_base, walk in list(self._walks.items()):
            if not self.fresh(walk.created):
                self._walk_pages_done += walk.pages
                del self._walks[walk_base]
            elif base.startswith(walk_base):
                return walk
        walk = FlatWalk(self._storage, self._root, base, self._clock())

        def listing_for(prefix: str) -> WalkedListing | None:
            return self._walked_listing(walk, prefix)

        walk.attach(listing_for)
        self._walks[base] = walk
        self._walks_started += 1
        return walk

    def _walked_listing(self, walk: FlatWalk, prefix: str) -> WalkedListing | None:
        """The listing `walk` fills for `prefix`; None if the folder is listed another way.
        A walk fills the listings it made to the end, even those the catalog dropped since
        (their TTL ended): a reader that opened one before then gets all of its entries."""
        own = walk.listings.get(prefix)
        if own is not None:
            return own
        if self.get(prefix) is not None:
            return None
        created = WalkedListing(walk, self._table, prefix, self._folder(prefix), walk.created)
        self._listings[prefix] = walk.listings[prefix] = created
        return created

    # -- negative lookups ------------------------------------------------------------------

    def note_missing(self, path: str) -> None:
        self._negative[path] = self._clock()

    def known_missing(self, path: str) -> bool:
        since = self._negative.get(path)
        if since is None:
            return False
        if self.fresh(since):
            return True
        del self._negative[path]
        return False

    def forget_missing(self, path: str) -> None:
        self._negative.pop(path, None)

    def statistics(self) -> CatalogStats:
        paged = self._paged_pages_done + sum(
            x.pages for x in self._listings.values() if isinstance(x, PagedListing)
        )
        walked = self._walk_pages_done + sum(w.pages for w in self._walks.values())
        return CatalogStats(
            mode=self.mode,
            listings=len(self._listings),
            paged_pages=paged,
            walks=self._walks_started,
            walk_pages=walked,
            negative_entries=len(self._negative),
        )
