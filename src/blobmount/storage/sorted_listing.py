"""One listing page over a sorted sequence of names, the way Azure pages a prefix listing.

Every store that keeps its names sorted (the in-memory client, the synthetic container, a
snapshot's table) answers `StorageClient.list_page` with this one walk, so they page, fold
folders and hand out continuation tokens alike. The names may be `str` or UTF-8 `bytes` (code
point order and UTF-8 byte order agree). `LazyNames` is the base of a sequence of names made on
demand (for `bisect`), for a store that does not hold them as a list.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import TypeVar, overload

from blobmount.storage.base import BlobProps, ListPage

#: above every character: `folder + AFTER_TEXT` sorts after every name inside `folder`
AFTER_TEXT = "\U0010ffff"
#: the same for UTF-8 bytes (0xff never occurs in UTF-8)
AFTER_BYTES = b"\xff"

Name = TypeVar("Name", str, bytes)


def sorted_list_page(
    names: Sequence[Name],
    prefix: Name,
    delimiter: Name | None,
    continuation: Name | None,
    max_results: int,
    *,
    after: Name,
    props: Callable[[int], BlobProps],
    text: Callable[[Name], str],
) -> ListPage:
    """The page of `names` (sorted) under `prefix` that begins at `continuation` (or at the
    first name under `prefix`), as `StorageClient.list_page` answers.

    Names that go on past the next `delimiter` (None or empty: no folding) are folded into one
    folder prefix; `props(position)` gives the blob at a position, `text` turns a name into
    `str`, and `after` is the sentinel that sorts after every name in a folder (`AFTER_TEXT` or
    `AFTER_BYTES`). The continuation token is the next name to list.
    """
    count = len(names)
    cut_from = len(prefix)
    delim = delimiter or prefix[:0]  # an empty one of the names' type: no folding
    position = bisect.bisect_left(names, continuation if continuation is not None else prefix)
    blobs: list[BlobProps] = []
    prefixes: list[str] = []
    while position < count and len(blobs) + len(prefixes) < max_results:
        name = names[position]
        if not name.startswith(prefix):
            break
        cut = name.find(delim, cut_from) if delim else -1
        if cut >= 0:
            folder = name[: cut + len(delim)]
            prefixes.append(text(folder))
            # skip every name inside this folder
            position = bisect.bisect_left(names, folder + after, position + 1)
        else:
            blobs.append(props(position))
            position += 1
    more = position < count and names[position].startswith(prefix)
    return ListPage(tuple(blobs), tuple(prefixes), text(names[position]) if more else None)


def sorted_text_page(
    names: Sequence[str],
    props: Callable[[int], BlobProps],
    prefix: str,
    delimiter: str | None,
    continuation: str | None,
    max_results: int,
) -> ListPage:
    """`sorted_list_page` over names held as text, with `list_page`'s arguments as they come."""
    return sorted_list_page(
        names, prefix, delimiter, continuation, max_results, after=AFTER_TEXT, props=props, text=str
    )


class LazyNames(Sequence[Name]):
    """Sorted names made on demand: a subclass gives `__len__` and `name_at(position)` for
    0 <= position < len; slices and the bounds check are here."""

    __slots__ = ()

    def name_at(self, position: int) -> Name:
        raise NotImplementedError

    @overload
    def __getitem__(self, position: int) -> Name: ...
    @overload
    def __getitem__(self, position: slice) -> Sequence[Name]: ...
    def __getitem__(self, position: int | slice) -> Name | Sequence[Name]:
        if isinstance(position, slice):
            return [self.name_at(p) for p in range(*position.indices(len(self)))]
        if not 0 <= position < len(self):
            raise IndexError(position)
        return self.name_at(position)
