"""Telling a live mount what a job will read next (the client side of the hint socket).

    from blobmount.hints.client import hinted, HintedSampler

    for path in hinted(paths_in_epoch_order, window=256):   # any iterable of paths
        with open(path, "rb") as f: ...

    # PyTorch: wrap the sampler; the DataLoader's workers then read files the mount already has
    sampler = HintedSampler(RandomSampler(dataset), path_of=lambda i: dataset.files[i])
    loader = DataLoader(dataset, sampler=sampler, num_workers=8)

`hinted` yields the items unchanged and keeps the mount told about the paths of the next
`window` items: it tops the window up in batches of an eighth of it, so the mount is woken once
per batch rather than once per item. Hints are advisory: if a path is not on a blobmount mount (or
the mount has gone), the items still come, a warning is logged once, and nothing else changes.
Paths are grouped by mount point, so one iterable may span several mounts.

The mount point of a path is found from /proc/self/mountinfo (a fuse.blobmount entry), never by
asking the mount itself.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from blobmount.mounttable import blobmount_mounts
from blobmount.runstate import hints_socket

log = logging.getLogger(__name__)

T = TypeVar("T")
DEFAULT_WINDOW = 256


class HintChannel:
    """One ordered stream of hints to the mounts the paths are on (one connection per mount)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        """`environ`: the daemons' environment, if not ours (it says where their sockets are)."""
        self._environ = environ
        self._mounts = blobmount_mounts()
        self._sockets: dict[str, socket.socket | None] = {}
        self._warned = False

    def send(self, paths: Iterable[str | os.PathLike[str]]) -> None:
        batches: dict[str, list[bytes]] = {}
        for path in paths:
            located = self._locate(os.path.abspath(os.fspath(path)))
            if located is not None:
                mount, rel = located
                batches.setdefault(mount, []).append(os.fsencode(rel) + b"\n")
        for mount, lines in batches.items():
            sock = self._socket(mount)
            if sock is None:
                continue
            try:
                sock.sendall(b"".join(lines))
            except OSError as exc:
                self._warn(f"the mount at {mount} stopped taking hints ({exc})")
                sock.close()
                self._sockets[mount] = None

    def _locate(self, path: str) -> tuple[str, str] | None:
        """(mount point, path relative to it), or None if `path` is not on a blobmount mount."""
        for candidate in (path, _resolved(path)):  # the second: through a symlink
            for mount in self._mounts:
                if candidate.startswith(mount.rstrip("/") + "/"):
                    return mount, candidate[len(mount.rstrip("/")) + 1 :]
        self._warn(f"{path} is not on a blobmount mount; no hints are sent for it")
        return None

    def _socket(self, mount: str) -> socket.socket | None:
        if mount not in self._sockets:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(os.fspath(hints_socket(Path(mount), self._environ)))
            except OSError as exc:
                sock.close()
                self._warn(f"cannot send hints to the mount at {mount} ({exc})")
                self._sockets[mount] = None
            else:
                self._sockets[mount] = sock
        return self._sockets[mount]

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("blobmount hints: %s (logged once)", message)

    def close(self) -> None:
        for sock in self._sockets.values():
            if sock is not None:
                sock.close()
        self._sockets.clear()

    def __enter__(self) -> HintChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def hinted(
    items: Iterable[T],
    *,
    window: int = DEFAULT_WINDOW,
    path_of: Callable[[T], str | os.PathLike[str]] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Iterator[T]:
    """Yield `items` in order, hinting the paths of the next `window` of them to the mount
    (at least 7/8 of `window` at any time). `path_of` maps an item to its path (default: the
    item is the path)."""
    if window < 1:
        raise ValueError("window must be at least 1")
    to_path: Callable[[T], str | os.PathLike[str]] = path_of or _as_path
    # one send per batch: each is a wake-up of the mount's hint task and a write here
    top_up_below = window - max(1, window // 8)
    source = iter(items)
    ahead: deque[T] = deque()
    exhausted = False
    with HintChannel(environ) as channel:
        while True:
            if len(ahead) <= top_up_below and not exhausted:
                new: list[str | os.PathLike[str]] = []
                while len(ahead) < window:
                    try:
                        item = next(source)
                    except StopIteration:
                        exhausted = True
                        break
                    ahead.append(item)
                    new.append(to_path(item))
                if new:
                    channel.send(new)
            if not ahead:
                return
            yield ahead.popleft()


class HintedSampler(Generic[T]):
    """Wraps a sampler (anything iterable, such as a torch.utils.data.Sampler) so each epoch's
    order is hinted to the mount `window` items ahead of the data loader."""

    def __init__(
        self,
        sampler: Iterable[T],
        path_of: Callable[[T], str | os.PathLike[str]],
        window: int = DEFAULT_WINDOW,
    ) -> None:
        self.sampler = sampler
        self.path_of = path_of
        self.window = window

    def __iter__(self) -> Iterator[T]:
        return hinted(self.sampler, window=self.window, path_of=self.path_of)

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # set_epoch and friends reach the wrapped sampler
        if name == "sampler":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.sampler, name)


def _as_path(item: Any) -> str | os.PathLike[str]:
    return item  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=4096)
def _realpath(folder: str) -> str:
    return os.path.realpath(folder)


def _resolved(path: str) -> str:
    folder, name = os.path.split(path)
    return os.path.join(_realpath(folder), name)
