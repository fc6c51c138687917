"""Inode table: stable inode numbers for paths, and kernel lookup counts.

An inode number is a 63-bit hash of the path, so a path keeps its number for the life of the
mount even after its node is freed (when the kernel forgets it) and made again later; only nodes
the kernel still knows, or that have open files, are held in memory. A hash collision (about one
in 10^7 for a million paths) is resolved by probing to the next free number.

Nodes hang off their parent folder (a dict of children per folder, no table of full paths), and a
node's path is spelled out from the chain of parents only when it is needed.
"""

from __future__ import annotations

import hashlib

from blobmount.namespace.listing import DirEntry

ROOT_INODE = 1
_MASK = (1 << 63) - 1


def inode_for(path: str) -> int:
    digest = hashlib.blake2b(path.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    value = int.from_bytes(digest, "little") & _MASK
    return value if value > ROOT_INODE else value + 2


class Node:
    """A file or folder the kernel knows about."""

    __slots__ = (
        "children",
        "etag",
        "fetched",
        "inode",
        "is_dir",
        "lookups",
        "mtime",
        "name",
        "open_etag",
        "opens",
        "parent",
        "size",
    )

    def __init__(self, inode: int, name: str, parent: Node | None, is_dir: bool) -> None:
        self.inode = inode
        self.name = name
        self.parent = parent
        self.is_dir = is_dir
        self.size = 0
        self.mtime = 0.0
        self.etag: str | None = None
        self.fetched = 0.0  # trio time the attributes were learned (for the attribute TTL)
        self.lookups = 0
        self.opens = 0
        self.open_etag: str | None = None  # version the kernel may hold pages of
        self.children: dict[str, Node] | None = None

    @property
    def path(self) -> str:
        """Relative to the mount root: '' for the root, no leading or trailing '/'."""
        parts = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            parts.append(node.name)
            node = node.parent
        return "/".join(reversed(parts))

    def child_path(self, name: str) -> str:
        path = self.path
        return f"{path}/{name}" if path else name

    def update(self, entry: DirEntry, now: float) -> None:
        self.is_dir = entry.is_dir
        self.size = entry.size
        self.mtime = entry.mtime
        self.etag = entry.etag
        self.fetched = now


class InodeTable:
    def __init__(self, now: float) -> None:
        self.root = Node(ROOT_INODE, "", None, True)
        self.root.fetched = now
        self._by_inode: dict[int, Node] = {ROOT_INODE: self.root}

    def __len__(self) -> int:
        return len(self._by_inode)

    def get(self, inode: int) -> Node | None:
        return self._by_inode.get(inode)

    def child(self, parent: Node, name: str) -> Node | None:
        return parent.children.get(name) if parent.children else None

    def upsert(self, parent: Node, entry: DirEntry, now: float) -> Node:
        """The node for `entry` in `parent`, created or brought up to date."""
        node = self.child(parent, entry.name)
        if node is None:
            inode = inode_for(parent.child_path(entry.name))
            while inode in self._by_inode:  # a collision: probe (astronomically rare)
                inode = inode + 1 if inode < _MASK else 2
            node = Node(inode, entry.name, parent, entry.is_dir)
            if parent.children is None:
                parent.children = {}
            parent.children[entry.name] = node
            self._by_inode[inode] = node
        node.update(entry, now)
        return node

    def forget(self, inode: int, count: int) -> None:
        node = self._by_inode.get(inode)
        if node is None:
            return
        node.lookups = max(0, node.lookups - count)
        self.release_if_unused(node)

    def release_if_unused(self, node: Node) -> None:
        """Free a node nobody refers to (the kernel forgot it, no open files, no children);
        its inode number comes back the same if the path is looked up again."""
        while (
            node.parent is not None and node.lookups == 0 and node.opens == 0 and not node.children
        ):
            parent = node.parent
            assert parent.children is not None
            del parent.children[node.name]
            del self._by_inode[node.inode]
            node = parent
