"""SnapshotTable: a snapshot's blobs in a few flat arrays, and listings answered from them.

A Python object per blob (a BlobProps and its strings) costs about 300 bytes; a million-blob
dataset would take 300 MB of every node's RAM. Here a blob costs its UTF-8 name plus about 46
bytes of array slots: the names are one `bytes` (sorted, indexed by an offsets array), sizes,
times and ETags are machine-word arrays, and Content-MD5s one `bytes` of 16 per blob. A listing
page is a binary search over the names and a walk forward, with the same answers, page breaks
and continuation tokens as `InMemoryStorageClient` holding the same blobs.

ETags of Azure's form (`"0x` and up to 16 upper-case hex digits`"`) are kept as a 64-bit number
and their digit count; any other ETag is kept as text on the side. Times are kept to the
millisecond (Azure's are whole seconds).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import re
from array import array
from collections.abc import Iterable, Iterator

from blobmount.storage.base import MAX_LIST_PAGE, BlobProps, ListPage
from blobmount.storage.sorted_listing import AFTER_BYTES, LazyNames, sorted_list_page

log = logging.getLogger(__name__)

#: flag bits, one byte per blob
FLAG_MD5 = 1  # the blob has a Content-MD5
FLAG_DIR_MARKER = 2  # a zero-length blob with hdi_isfolder=true
KNOWN_FLAGS = FLAG_MD5 | FLAG_DIR_MARKER
MD5_BYTES = 16
#: the longest blob name the format can hold, in UTF-8 bytes (Azure allows 1,024 characters)
MAX_NAME_BYTES = 0xFFFF

_AZURE_ETAG = re.compile(r'"0x([0-9A-F]{1,16})"')


def pack_etag(etag: str) -> tuple[int, int]:
    """(digit count, value) for an ETag of Azure's form, (0, 0) for any other (kept as text)."""
    match = _AZURE_ETAG.fullmatch(etag)
    if match is None:
        return 0, 0
    return len(match[1]), int(match[1], 16)


def unpack_etag(kind: int, value: int) -> str:
    return f'"0x{value:0{kind}X}"'


def offsets_array(lengths: Iterable[int], total: int) -> array[int]:
    """Start offsets of consecutive items of `lengths` (one more than there are items), in 4
    bytes each when the whole fits, else 8."""
    return array("I" if total < 2**32 else "Q", itertools.accumulate(lengths, initial=0))


class _Names(LazyNames[bytes]):
    """The sorted names as a sequence of bytes, for `bisect`."""

    __slots__ = ("_blob", "_offsets")

    def __init__(self, blob: bytes, offsets: array[int]) -> None:
        self._blob = blob
        self._offsets = offsets

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def name_at(self, position: int) -> bytes:
        offsets = self._offsets
        return self._blob[offsets[position] : offsets[position + 1]]


class SnapshotTable:
    """The blobs of one snapshot, sorted by name (UTF-8 byte order, which is code point order).

    Built by `TableBuilder` or by `blobmount.snapshots.format.decode`; immutable after that.
    """

    __slots__ = (
        "_etag_kinds",
        "_etag_values",
        "_flags",
        "_md5s",
        "_mtimes_ms",
        "_names",
        "_raw_etags",
        "_sizes",
        "_total_bytes",
        "names_blob",
        "offsets",
    )

    def __init__(
        self,
        names_blob: bytes,
        offsets: array[int],
        sizes: array[int],
        mtimes_ms: array[int],
        etag_kinds: bytes,
        etag_values: array[int],
        raw_etags: dict[int, str],
        flags: bytes,
        md5s: bytes,
    ) -> None:
        count = len(offsets) - 1
        columns = (len(sizes), len(mtimes_ms), len(etag_kinds), len(etag_values), len(flags))
        if count < 0 or any(length != count for length in columns):
            raise ValueError("snapshot columns of different lengths")
        if md5s and len(md5s) != MD5_BYTES * count:
            raise ValueError("snapshot MD5 column of the wrong length")
        if offsets[0] != 0 or offsets[-1] != len(names_blob):
            raise ValueError("snapshot name offsets do not match the names")
        self.names_blob = names_blob
        self.offsets = offsets
        self._names = _Names(names_blob, offsets)
        self._sizes = sizes
        self._mtimes_ms = mtimes_ms
        self._etag_kinds = etag_kinds
        self._etag_values = etag_values
        self._raw_etags = raw_etags
        self._flags = flags
        self._md5s = md5s
        self._total_bytes = sum(sizes)

    # -- columns, for the file format and `diff` ----------------------------------------------

    @property
    def sizes(self) -> array[int]:
        return self._sizes

    @property
    def mtimes_ms(self) -> array[int]:
        return self._mtimes_ms

    @property
    def etag_kinds(self) -> bytes:
        return self._etag_kinds

    @property
    def etag_values(self) -> array[int]:
        return self._etag_values

    @property
    def raw_etags(self) -> dict[int, str]:
        return self._raw_etags

    @property
    def flags(self) -> bytes:
        return self._flags

    @property
    def md5s(self) -> bytes:
        return self._md5s

    # -- one blob ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._sizes)

    @property
    def total_bytes(self) -> int:
        return self._total_bytes

    @property
    def nbytes(self) -> int:
        """The RAM the columns hold (the raw-ETag dict estimated at 150 bytes an entry)."""
        arrays = (self.offsets, self._sizes, self._mtimes_ms, self._etag_values)
        held = sum(a.itemsize * len(a) for a in arrays)
        held += len(self.names_blob) + len(self._etag_kinds) + len(self._flags) + len(self._md5s)
        return held + 150 * len(self._raw_etags)

    def name_bytes(self, index: int) -> bytes:
        return self._names[index]

    def name(self, index: int) -> str:
        return self._names[index].decode()

    def etag(self, index: int) -> str:
        kind = self._etag_kinds[index]
        if kind == 0:
            return self._raw_etags[index]
        return unpack_etag(kind, self._etag_values[index])

    def props(self, index: int) -> BlobProps:
        flags = self._flags[index]
        md5 = None
        if flags & FLAG_MD5:
            md5 = self._md5s[MD5_BYTES * index : MD5_BYTES * (index + 1)]
        return BlobProps(
            name=self.name(index),
            size=self._sizes[index],
            etag=self.etag(index),
            last_modified=self._mtimes_ms[index] / 1000,
            content_md5=md5,
            is_dir_marker=bool(flags & FLAG_DIR_MARKER),
        )

    def find(self, name: str) -> int | None:
        """The index of the blob named `name`, or None."""
        key = name.encode()
        index = bisect.bisect_left(self._names, key)
        if index < len(self) and self._names[index] == key:
            return index
        return None

    def first_under(self, prefix: str) -> int | None:
        """The index of the first blob whose name starts with `prefix`, or None."""
        key = prefix.encode()
        index = bisect.bisect_left(self._names, key)
        if index < len(self) and self._names[index].startswith(key):
            return index
        return None

    def all_props(self) -> Iterator[BlobProps]:
        return (self.props(index) for index in range(len(self)))

    # -- listing -------------------------------------------------------------------------------

    def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        continuation: str | None = None,
        max_results: int = MAX_LIST_PAGE,
    ) -> ListPage:
        """A page of the blobs under `prefix`, as `StorageClient.list_page` answers: names that
        go on past the next `delimiter` folded into one folder prefix; the continuation is the
        next name to list."""
        return sorted_list_page(
            self._names,
            prefix.encode(),
            delimiter.encode() if delimiter else None,
            continuation.encode() if continuation is not None else None,
            max_results,
            after=AFTER_BYTES,
            props=self.props,
            text=bytes.decode,
        )


class TableBuilder:
    """Collects blobs (from a listing, in any order) into a `SnapshotTable`."""

    def __init__(self) -> None:
        self._names: list[bytes] = []
        self._sizes: array[int] = array("Q")
        self._mtimes_ms: array[int] = array("q")
        self._kinds = bytearray()
        self._values: array[int] = array("Q")
        self._raw: dict[int, str] = {}
        self._flags = bytearray()
        self._md5s = bytearray()
        self._in_order = True

    def __len__(self) -> int:
        return len(self._names)

    def add(self, props: BlobProps) -> None:
        """Record one blob.

        Raises:
            ValueError: the name is too long for the format.
        """
        name = props.name.encode()
        if len(name) > MAX_NAME_BYTES:
            raise ValueError(f"blob name of {len(name)} bytes is too long for a snapshot")
        if self._names and name <= self._names[-1]:
            self._in_order = False
        index = len(self._names)
        self._names.append(name)
        self._sizes.append(props.size)
        self._mtimes_ms.append(round(props.last_modified * 1000))
        kind, value = pack_etag(props.etag)
        if kind == 0:
            self._raw[index] = props.etag
        self._kinds.append(kind)
        self._values.append(value)
        flags = FLAG_DIR_MARKER if props.is_dir_marker else 0
        if props.content_md5 is not None and len(props.content_md5) == MD5_BYTES:
            flags |= FLAG_MD5
            self._md5s += props.content_md5
        else:
            self._md5s += bytes(MD5_BYTES)
        self._flags.append(flags)

    def build(self) -> SnapshotTable:
        """The table, sorted by name.

        Raises:
            ValueError: a name was added twice.
        """
        if self._in_order:
            names, order = self._names, None
        else:
            order = sorted(range(len(self._names)), key=self._names.__getitem__)
            names = [self._names[i] for i in order]
        for before, after in itertools.pairwise(names):
            if before == after:
                raise ValueError(f"blob {after.decode()!r} listed twice")
        has_md5 = any(f & FLAG_MD5 for f in self._flags)
        offsets = offsets_array(map(len, names), sum(map(len, names)))
        if order is None:
            return SnapshotTable(
                b"".join(names),
                offsets,
                self._sizes,
                self._mtimes_ms,
                bytes(self._kinds),
                self._values,
                dict(self._raw),
                bytes(self._flags),
                bytes(self._md5s) if has_md5 else b"",
            )
        md5s = self._md5s
        return SnapshotTable(
            b"".join(names),
            offsets,
            array("Q", (self._sizes[i] for i in order)),
            array("q", (self._mtimes_ms[i] for i in order)),
            bytes(self._kinds[i] for i in order),
            array("Q", (self._values[i] for i in order)),
            {new: self._raw[old] for new, old in enumerate(order) if old in self._raw},
            bytes(self._flags[i] for i in order),
            b"".join(md5s[MD5_BYTES * i : MD5_BYTES * (i + 1)] for i in order) if has_md5 else b"",
        )


def table_of(blobs: Iterable[BlobProps]) -> SnapshotTable:
    """A table of `blobs` (any order)."""
    builder = TableBuilder()
    for props in blobs:
        builder.add(props)
    return builder.build()
