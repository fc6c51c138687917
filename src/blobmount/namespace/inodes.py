"""Nodes (one per file or folder name the mount knows) and the inode table that finds them.

A node is both a folder listing's entry and, once the kernel learns of it, an inode: one object
per name, packed small, since a big dataset has millions. Its attributes (folder flag, size,
mtime, ETag) and its name live in one immutable `bytes` record; its folder's path is a string
shared by every node of that folder; opened-file state hangs off a side object only files that
were opened have. The cost is measured by benchmarks/metadata_memory.py and bounded by
tests/unit/test_metadata_memory.py.

An inode number is a 60-bit hash of the path, so a path keeps its number for the life of the
mount even after its node is freed and made again later. The table maps numbers to nodes, and
finds a folder's child by hashing the child's path: no per-folder dict of children. A hash
collision (a million paths hold one with a chance of about 1 in 2 million) is resolved by
probing to the next free number and remembering that path's number in a small side table.

A node stays in the table while anything may ask for it: the kernel holds lookups on it, a file
of it is open, or its folder's current listing holds it (`listed`). Memory for a node goes when
the last of these ends: a kernel forget of a node no listing holds, or the end (attribute TTL)
of the listing that held a node the kernel had forgotten.
"""

from __future__ import annotations

import hashlib
import re
import struct
from typing import Protocol

ROOT_INODE = 1
#: 60 bits: the number fits a two-digit Python int (32 bytes rather than 48 for 63 bits)
_MASK = (1 << 60) - 1

# record layout: flags, size, mtime, [ETag], name (UTF-8)
_HEAD = struct.Struct("<Bqd")
_HEX = struct.Struct("<Q")
_RAW_LEN = struct.Struct("<H")
_DIR = 0x01
_LISTED = 0x02
_ETAG_KIND = 0x0C  # two bits: none / hex / raw
_ETAG_NONE, _ETAG_HEX, _ETAG_RAW = 0x00, 0x04, 0x08
_HEX_WIDTH_SHIFT = 4  # upper nibble: number of hex digits - 1
#: Azure's ETag shape, stored as an 8-byte number: "0x8DBEB8E3A4C7D2F", quoted
_AZURE_ETAG = re.compile(r'"0x([0-9A-F]{1,16})"')


def inode_for(path: str) -> int:
    digest = hashlib.blake2b(path.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    value = int.from_bytes(digest, "little") & _MASK
    return value if value > ROOT_INODE else value + 2


def _pack(flags: int, size: int, mtime: float, etag: str | None, name: str) -> bytes:
    encoded = name.encode("utf-8", "surrogatepass")
    if etag is None:
        return _HEAD.pack(flags, size, mtime) + encoded
    match = _AZURE_ETAG.fullmatch(etag)
    if match is not None:
        digits = match.group(1)
        flags |= _ETAG_HEX | (len(digits) - 1) << _HEX_WIDTH_SHIFT
        return _HEAD.pack(flags, size, mtime) + _HEX.pack(int(digits, 16)) + encoded
    raw = etag.encode("utf-8", "surrogatepass")
    return _HEAD.pack(flags | _ETAG_RAW, size, mtime) + _RAW_LEN.pack(len(raw)) + raw + encoded


def _name_offset(rec: bytes) -> int:
    kind = rec[0] & _ETAG_KIND
    if kind == _ETAG_NONE:
        return _HEAD.size
    if kind == _ETAG_HEX:
        return _HEAD.size + _HEX.size
    length: int = _RAW_LEN.unpack_from(rec, _HEAD.size)[0]
    return _HEAD.size + _RAW_LEN.size + length


class Attributes(Protocol):
    """What a node is made or updated from: a properties request's answer."""

    @property
    def name(self) -> str: ...
    @property
    def is_dir(self) -> bool: ...
    @property
    def size(self) -> int: ...
    @property
    def mtime(self) -> float: ...
    @property
    def etag(self) -> str | None: ...


class _OpenState:
    """Only for files that were opened: how many handles, and the version the kernel may hold
    pages of."""

    __slots__ = ("open_etag", "opens")

    def __init__(self) -> None:
        self.opens = 0
        self.open_etag: str | None = None


class Node:
    """A file or folder of the mount: a listing's entry and, once the kernel knows it, an inode."""

    __slots__ = ("_rec", "extra", "fetched", "folder", "inode", "lookups")

    def __init__(
        self,
        inode: int,
        folder: str | None,
        name: str,
        is_dir: bool,
        size: int,
        mtime: float,
        etag: str | None,
        fetched: float,
    ) -> None:
        self.inode = inode
        #: the folder's path relative to the mount root ('' for the root's children), shared by
        #: the folder's nodes; None only for the root itself
        self.folder = folder
        self._rec = _pack(_DIR if is_dir else 0, size, mtime, etag, name)
        self.fetched = fetched  # trio time the attributes were learned (for the attribute TTL)
        self.lookups = 0  # the kernel's lookup count
        self.extra: _OpenState | None = None

    # -- the packed record -----------------------------------------------------------------

    @property
    def name(self) -> str:
        rec = self._rec
        return rec[_name_offset(rec) :].decode("utf-8", "surrogatepass")

    @property
    def is_dir(self) -> bool:
        return bool(self._rec[0] & _DIR)

    @property
    def size(self) -> int:
        size: int = _HEAD.unpack_from(self._rec)[1]
        return size

    @property
    def mtime(self) -> float:
        mtime: float = _HEAD.unpack_from(self._rec)[2]
        return mtime

    @property
    def etag(self) -> str | None:
        rec = self._rec
        kind = rec[0] & _ETAG_KIND
        if kind == _ETAG_NONE:
            return None
        if kind == _ETAG_HEX:
            width = (rec[0] >> _HEX_WIDTH_SHIFT) + 1
            return f'"0x{_HEX.unpack_from(rec, _HEAD.size)[0]:0{width}X}"'
        (length,) = _RAW_LEN.unpack_from(rec, _HEAD.size)
        start = _HEAD.size + _RAW_LEN.size
        return rec[start : start + length].decode("utf-8", "surrogatepass")

    @property
    def listed(self) -> bool:
        """True while its folder's current listing holds this node."""
        return bool(self._rec[0] & _LISTED)

    @listed.setter
    def listed(self, value: bool) -> None:
        rec = self._rec
        flags = rec[0] | _LISTED if value else rec[0] & ~_LISTED
        if flags != rec[0]:
            self._rec = bytes((flags,)) + rec[1:]

    def set(self, is_dir: bool, size: int, mtime: float, etag: str | None, fetched: float) -> None:
        """New attributes (the name and the listed flag stay)."""
        flags = (_DIR if is_dir else 0) | (self._rec[0] & _LISTED)
        self._rec = _pack(flags, size, mtime, etag, self.name)
        self.fetched = fetched

    def update(self, entry: Attributes, now: float) -> None:
        self.set(entry.is_dir, entry.size, entry.mtime, entry.etag, now)

    # -- open files ------------------------------------------------------------------------

    @property
    def opens(self) -> int:
        return 0 if self.extra is None else self.extra.opens

    @opens.setter
    def opens(self, value: int) -> None:
        if self.extra is None:
            self.extra = _OpenState()
        self.extra.opens = value

    @property
    def open_etag(self) -> str | None:
        """The version the kernel may hold cached pages of."""
        return None if self.extra is None else self.extra.open_etag

    @open_etag.setter
    def open_etag(self, value: str | None) -> None:
        if self.extra is None:
            self.extra = _OpenState()
        self.extra.open_etag = value

    # -- where it is -----------------------------------------------------------------------

    @property
    def path(self) -> str:
        """Relative to the mount root: '' for the root, no leading or trailing '/'."""
        return "" if self.folder is None else join(self.folder, self.name)

    def child_path(self, name: str) -> str:
        return join(self.path, name)

    def __repr__(self) -> str:
        return f"Node({self.path!r}, inode={self.inode}, dir={self.is_dir})"


def join(folder: str, name: str) -> str:
    """The path of `name` in the folder with path `folder` ('' for the root)."""
    return f"{folder}/{name}" if folder else name


class InodeTable:
    def __init__(self, now: float) -> None:
        self.root = Node(ROOT_INODE, None, "", True, 0, 0.0, None, now)
        self._nodes: dict[int, Node] = {ROOT_INODE: self.root}
        #: the few paths whose number is not their hash (it collided with another path's)
        self._collided: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def get(self, inode: int) -> Node | None:
        return self._nodes.get(inode)

    def number(self, path: str) -> int:
        """The inode number of `path` (its hash, unless that collided with another path)."""
        number = self._collided.get(path) if self._collided else None
        return inode_for(path) if number is None else number

    def locate(self, folder: str, name: str) -> tuple[int, Node | None]:
        """The inode number of `name` in the folder with path `folder`, and its node if the
        table holds one."""
        number = self.number(join(folder, name))
        node = self._nodes.get(number)
        if node is None or node.folder != folder or node.name != name:
            return number, None
        return number, node

    def find(self, folder: str, name: str) -> Node | None:
        return self.locate(folder, name)[1]

    def child(self, parent: Node, name: str) -> Node | None:
        return self.find(parent.path, name)

    def register(self, node: Node) -> Node:
        """Put a new node in the table; if an equal one (same path) is there, that one."""
        number = node.inode
        while (other := self._nodes.get(number)) is not None:
            if other is node or (other.folder == node.folder and other.name == node.name):
                return other
            number = number + 1 if number < _MASK else 2  # a collision: probe (very rare)
        if number != node.inode:
            node.inode = number
            self._collided[node.path] = number
        self._nodes[number] = node
        return node

    def list_entry(self, node: Node) -> Node:
        """A listing's new node for a name its folder's listing does not hold yet, put in the
        table; or, if the table has a node of that path already, that one brought up to date."""
        held = self.register(node)
        if held is not node:
            held._rec, held.fetched = node._rec, node.fetched  # same path, so the same name
        held.listed = True
        return held

    def upsert(self, parent: Node, entry: Attributes | Node, now: float) -> Node:
        """The node for `entry` in `parent`, in the table, brought up to date. A Node (a
        listing's entry) is taken as it is; other attributes (a properties request's answer)
        update the table's node or make a new one."""
        if isinstance(entry, Node):
            return entry if self._nodes.get(entry.inode) is entry else self.register(entry)
        folder, name = parent.path, entry.name
        number, node = self.locate(folder, name)
        if node is None:
            return self.register(
                Node(number, folder, name, entry.is_dir, entry.size, entry.mtime, entry.etag, now)
            )
        node.update(entry, now)
        return node

    def forget(self, inode: int, count: int) -> None:
        node = self._nodes.get(inode)
        if node is None:
            return
        node.lookups = max(0, node.lookups - count)
        self.release_if_unused(node)

    def unlist(self, node: Node) -> None:
        """Its folder's listing no longer holds the node (the listing expired)."""
        if self._nodes.get(node.inode) is node:
            node.listed = False
            self.release_if_unused(node)

    def release_if_unused(self, node: Node) -> None:
        """Free a node nothing refers to (the kernel forgot it, no open files, no listing holds
        it); its inode number comes back the same if the path is looked up again."""
        if (
            node.folder is None
            or node.lookups
            or node.listed
            or (node.extra is not None and node.extra.opens)
        ):
            return
        if self._nodes.get(node.inode) is node:
            del self._nodes[node.inode]
            if self._collided:
                self._collided.pop(node.path, None)
