"""Inode table: stable inode numbers for paths, and kernel lookup counts.

Inode numbers are never reused while the mount lives: a path keeps its inode, even if the blob
behind it changes (the attributes change instead).
"""

from __future__ import annotations

from dataclasses import dataclass

from blobmount.storage.base import BlobProps

ROOT_INODE = 1


@dataclass(slots=True, eq=False)
class Node:
    inode: int
    path: str  # relative to the mount root, '' for the root, no leading or trailing '/'
    is_dir: bool
    props: BlobProps | None
    fetched: float  # trio time the props were learned (for the attribute TTL)
    lookups: int = 0
    open_etag: str | None = None  # version the kernel may hold pages of


class InodeTable:
    def __init__(self, now: float) -> None:
        root = Node(ROOT_INODE, "", True, None, now)
        self._by_inode: dict[int, Node] = {ROOT_INODE: root}
        self._by_path: dict[str, Node] = {"": root}
        self._next = ROOT_INODE + 1

    def __len__(self) -> int:
        return len(self._by_inode)

    def get(self, inode: int) -> Node | None:
        return self._by_inode.get(inode)

    def by_path(self, path: str) -> Node | None:
        return self._by_path.get(path)

    def upsert(self, path: str, is_dir: bool, props: BlobProps | None, now: float) -> Node:
        """The node for `path`, created or brought up to date with what storage said."""
        node = self._by_path.get(path)
        if node is None:
            node = Node(self._next, path, is_dir, props, now)
            self._next += 1
            self._by_inode[node.inode] = node
            self._by_path[path] = node
        else:
            node.is_dir = is_dir
            if props is not None or is_dir:
                node.props = props
            node.fetched = now
        return node

    def forget(self, inode: int, count: int) -> None:
        node = self._by_inode.get(inode)
        if node is not None:
            node.lookups = max(0, node.lookups - count)
