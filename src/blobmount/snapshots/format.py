"""The snapshot file format (version 1): a header, the blobs as compressed columns, a checksum.

Frame (integers big-endian)::

    magic            13  b"\\x89blobsnap\\r\\n\\x1a\\n" (binary: mangled line ends show)
    version           2  1
    header length     4  H
    header            H  JSON, UTF-8: source (display URI, never a secret), location
                         (account/container), prefix, created (seconds since the epoch),
                         entries, total_bytes, writer (blobmount version)
    body length raw   8  the columns' length before compression
    body length       8  B
    body              B  the columns, zlib-compressed
    checksum          4  CRC-32 of every byte before it
    end               4  b"END\\n"

The body holds one column after another, entries sorted by name (UTF-8 byte order). Numbers in
columns are little-endian and split into byte planes (all first bytes, then all second bytes,
...), which groups the mostly-equal high bytes for the compressor:

    shared       u16 x n   front coding: bytes shared with the previous name
    suffix len   u16 x n   bytes that follow them
    suffixes               those bytes, one name after another
    size         u64 x n
    modified     i64 x n   milliseconds since the epoch
    etag kind    u8  x n   0: kept as text below; 1-16: `"0x<that many hex digits>"`
    etag value   u64 x n   the hex digits' value (0 for kind 0)
    etag text              for each kind-0 entry: u16 length, UTF-8 text
    flags        u8  x n   1: has a Content-MD5, 2: a folder marker (hdi_isfolder)
    content md5            16 bytes for each entry with flag 1

A reader checks, in this order, the magic, the version, the frame's lengths (a truncated file),
the checksum (a corrupt one), then the columns against the header's counts, and refuses the
file with a `SnapshotError` naming what is wrong before anything uses it.
"""

from __future__ import annotations

import itertools
import json
import logging
import operator
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass

from blobmount._version import __version__
from blobmount.errors import ConfigError
from blobmount.snapshots.table import (
    FLAG_MD5,
    KNOWN_FLAGS,
    MD5_BYTES,
    SnapshotTable,
    offsets_array,
)

log = logging.getLogger(__name__)

MAGIC = b"\x89blobsnap\r\n\x1a\n"
END = b"END\n"
VERSION = 1
#: zlib level: 9 costs 15 times the time of 6 for a few percent
COMPRESSION_LEVEL = 6

_VERSION = struct.Struct(">H")
_HEADER_LEN = struct.Struct(">I")
_BODY_LENS = struct.Struct(">QQ")
_CHECKSUM = struct.Struct(">I")
_PREAMBLE = len(MAGIC) + _VERSION.size + _HEADER_LEN.size
_TRAILER = _CHECKSUM.size + len(END)
_U16 = struct.Struct("<H")
_HEADER_KEYS = ("source", "location", "prefix", "created", "entries", "total_bytes")
_BIG_ENDIAN = sys.byteorder == "big"


class SnapshotError(ConfigError):
    """A snapshot cannot be used: not a snapshot, another format version, truncated, corrupt,
    or of another source. Retrying cannot help: the message says what to do instead."""


@dataclass(frozen=True, slots=True)
class SnapshotHeader:
    """What a snapshot says about itself."""

    source: str  # the display URI it was made from (no secret)
    location: str  # account/container, as StorageClient.location
    prefix: str  # '' or 'a/b/': every name starts with it
    created: float  # seconds since the epoch
    entries: int
    total_bytes: int
    writer: str = ""  # the blobmount version that wrote it
    version: int = VERSION


@dataclass(frozen=True, slots=True)
class Snapshot:
    header: SnapshotHeader
    table: SnapshotTable


# -- writing -----------------------------------------------------------------------------------


def _planes(numbers: array[int]) -> bytes:
    """`numbers` little-endian, as byte planes."""
    if _BIG_ENDIAN:
        numbers = array(numbers.typecode, numbers)
        numbers.byteswap()
    raw, width = numbers.tobytes(), numbers.itemsize
    return b"".join(raw[k::width] for k in range(width))


def _front_coded(table: SnapshotTable) -> tuple[array[int], array[int], bytes]:
    shared: array[int] = array("H")
    lengths: array[int] = array("H")
    suffixes = bytearray()
    previous = b""
    for index in range(len(table)):
        name = table.name_bytes(index)
        common = min(len(name), len(previous))
        # the first differing byte, found by one XOR of the two as big numbers
        diff = int.from_bytes(name[:common]) ^ int.from_bytes(previous[:common])
        same = common - (diff.bit_length() + 7) // 8
        shared.append(same)
        lengths.append(len(name) - same)
        suffixes += name[same:]
        previous = name
    return shared, lengths, bytes(suffixes)


def _columns(table: SnapshotTable) -> bytes:
    shared, lengths, suffixes = _front_coded(table)
    other_etags = bytearray()
    for index in sorted(table.raw_etags):
        text = table.raw_etags[index].encode()
        other_etags += _U16.pack(len(text)) + text
    md5s = b""
    if table.md5s and all(f & FLAG_MD5 for f in set(table.flags)):
        md5s = table.md5s
    elif table.md5s:
        present = [i for i, flags in enumerate(table.flags) if flags & FLAG_MD5]
        md5s = b"".join(table.md5s[MD5_BYTES * i : MD5_BYTES * (i + 1)] for i in present)
    return b"".join(
        (
            _planes(shared),
            _planes(lengths),
            suffixes,
            _planes(table.sizes),
            _planes(table.mtimes_ms),
            table.etag_kinds,
            _planes(table.etag_values),
            bytes(other_etags),
            table.flags,
            md5s,
        )
    )


def encode(
    table: SnapshotTable, *, source: str, location: str, prefix: str, created: float
) -> bytes:
    """The snapshot file of `table`."""
    header = {
        "source": source,
        "location": location,
        "prefix": prefix,
        "created": created,
        "entries": len(table),
        "total_bytes": table.total_bytes,
        "writer": f"blobmount {__version__}",
    }
    header_bytes = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode()
    raw = _columns(table)
    body = zlib.compress(raw, COMPRESSION_LEVEL)
    framed = b"".join(
        (
            MAGIC,
            _VERSION.pack(VERSION),
            _HEADER_LEN.pack(len(header_bytes)),
            header_bytes,
            _BODY_LENS.pack(len(raw), len(body)),
            body,
        )
    )
    return framed + _CHECKSUM.pack(zlib.crc32(framed)) + END


# -- reading -----------------------------------------------------------------------------------


def _damaged(origin: str, what: str) -> SnapshotError:
    return SnapshotError(
        f"snapshot {origin} is {what}; make it again with `blobmount snapshot create`"
    )


def _frame(data: bytes, origin: str) -> tuple[SnapshotHeader, int, int, int]:
    """Check the frame and checksum; (header, raw body length, body start, body end)."""
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):
            raise _damaged(origin, f"truncated ({len(data)} bytes)")
        raise SnapshotError(f"{origin} is not a blobmount snapshot (no snapshot signature)")
    if len(data) < _PREAMBLE:
        raise _damaged(origin, f"truncated ({len(data)} bytes)")
    (version,) = _VERSION.unpack_from(data, len(MAGIC))
    if version != VERSION:
        raise SnapshotError(
            f"snapshot {origin} is of format version {version}; blobmount {__version__} reads "
            f"version {VERSION}: use a blobmount that reads it, or make the snapshot again"
        )
    (header_len,) = _HEADER_LEN.unpack_from(data, len(MAGIC) + _VERSION.size)
    body_start = _PREAMBLE + header_len + _BODY_LENS.size
    if len(data) < body_start:
        raise _damaged(origin, f"truncated ({len(data)} bytes, inside its header)")
    raw_len, body_len = _BODY_LENS.unpack_from(data, _PREAMBLE + header_len)
    expected = body_start + body_len + _TRAILER
    if len(data) < expected:
        raise _damaged(origin, f"truncated ({len(data)} of {expected} bytes)")
    if len(data) > expected or not data.endswith(END):
        raise _damaged(origin, f"corrupt ({len(data)} bytes where its frame says {expected})")
    body_end = body_start + body_len
    (checksum,) = _CHECKSUM.unpack_from(data, body_end)
    if zlib.crc32(memoryview(data)[:body_end]) != checksum:
        raise _damaged(origin, "corrupt (its checksum does not match its contents)")
    try:
        fields = json.loads(data[_PREAMBLE : _PREAMBLE + header_len])
        header = SnapshotHeader(
            source=str(fields["source"]),
            location=str(fields["location"]),
            prefix=str(fields["prefix"]),
            created=float(fields["created"]),
            entries=int(fields["entries"]),
            total_bytes=int(fields["total_bytes"]),
            writer=str(fields.get("writer", "")),
            version=version,
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise _damaged(origin, f"corrupt (unreadable header: {type(exc).__name__})") from None
    return header, raw_len, body_start, body_end


def read_header(data: bytes, origin: str) -> SnapshotHeader:
    """The header of a snapshot file, after checking its frame and checksum (not its columns).

    Raises:
        SnapshotError: not a snapshot, another version, truncated or corrupt.
    """
    return _frame(data, origin)[0]


class _Reader:
    """Reads the columns one after another; any overrun is a corrupt file."""

    def __init__(self, raw: bytes, count: int) -> None:
        self.raw = memoryview(raw)
        self.count = count
        self.pos = 0

    def take(self, length: int) -> memoryview:
        end = self.pos + length
        if end > len(self.raw):
            raise ValueError("columns shorter than the header says")
        piece, self.pos = self.raw[self.pos : end], end
        return piece

    def numbers(self, typecode: str) -> array[int]:
        out: array[int] = array(typecode)
        width, count = out.itemsize, self.count
        planes = self.take(width * count)
        joined = bytearray(width * count)
        for k in range(width):
            joined[k::width] = planes[k * count : (k + 1) * count]
        out.frombytes(joined)
        if _BIG_ENDIAN:
            out.byteswap()
        return out


def _names(shared: array[int], lengths: array[int], suffixes: bytes) -> tuple[bytes, array[int]]:
    """The names blob and its offsets, from the front-coded columns."""
    full = array("H", map(operator.add, shared, lengths))
    if shared and shared[0] != 0:
        raise ValueError("the first name shares bytes with nothing")
    # each name may share at most the whole of the one before it
    if any(map(operator.gt, itertools.islice(shared, 1, None), full)):
        raise ValueError("a name shares more than the one before it holds")
    if sum(lengths) != len(suffixes):
        raise ValueError("name suffixes of the wrong length")
    out = bytearray()
    previous = 0
    for same, end, length in zip(shared, itertools.accumulate(lengths), lengths, strict=True):
        here = len(out)
        out += out[previous : previous + same]
        out += suffixes[end - length : end]
        previous = here
    names = bytes(out)
    return names, offsets_array(full, len(names))


def _table(raw: bytes, count: int) -> SnapshotTable:
    reader = _Reader(raw, count)
    shared = reader.numbers("H")
    lengths = reader.numbers("H")
    suffixes = bytes(reader.take(sum(lengths)))
    names, offsets = _names(shared, lengths, suffixes)
    sizes = reader.numbers("Q")
    mtimes = reader.numbers("q")
    kinds = bytes(reader.take(count))
    if max(kinds, default=0) > 16:
        raise ValueError("an ETag kind out of range")
    values = reader.numbers("Q")
    raw_etags: dict[int, str] = {}
    index = kinds.find(0)
    while index >= 0:
        (length,) = _U16.unpack(reader.take(_U16.size))
        raw_etags[index] = bytes(reader.take(length)).decode()
        index = kinds.find(0, index + 1)
    flags = bytes(reader.take(count))
    kinds_of_flags = set(flags)
    if any(f & ~KNOWN_FLAGS for f in kinds_of_flags):
        raise ValueError("unknown entry flags")
    md5s = b""
    if all(f & FLAG_MD5 for f in kinds_of_flags) and count:
        md5s = bytes(reader.take(MD5_BYTES * count))  # the usual case: every blob has one
    elif any(f & FLAG_MD5 for f in kinds_of_flags):
        with_md5 = [i for i, f in enumerate(flags) if f & FLAG_MD5]
        packed = reader.take(MD5_BYTES * len(with_md5))
        spread = bytearray(MD5_BYTES * count)
        for k, index in enumerate(with_md5):
            spread[MD5_BYTES * index : MD5_BYTES * (index + 1)] = packed[
                MD5_BYTES * k : MD5_BYTES * (k + 1)
            ]
        md5s = bytes(spread)
    if reader.pos != len(raw):
        raise ValueError("columns longer than the header says")
    return SnapshotTable(names, offsets, sizes, mtimes, kinds, values, raw_etags, flags, md5s)


def decode(data: bytes, origin: str) -> Snapshot:
    """A snapshot file's header and table; `origin` names the file in messages.

    Raises:
        SnapshotError: not a snapshot, another format version, truncated or corrupt.
    """
    header, raw_len, body_start, body_end = _frame(data, origin)
    try:
        raw = zlib.decompress(memoryview(data)[body_start:body_end], bufsize=max(raw_len, 1))
        if len(raw) != raw_len:
            raise ValueError("columns of another length than the frame says")
        table = _table(raw, header.entries)
    except (zlib.error, ValueError, UnicodeDecodeError, struct.error) as exc:
        raise _damaged(origin, f"corrupt ({exc})") from None
    if table.total_bytes != header.total_bytes:
        raise _damaged(origin, "corrupt (its sizes do not add up to its header's total)")
    return Snapshot(header, table)
