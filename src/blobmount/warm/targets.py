"""What `blobmount warm` reads: the PATHs given, checked to lie inside the mount, and the regular
files under them in a stable order (sorted names, a folder's files before its subfolders), so a
rerun that stops at the same cache limit warms the same files."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from blobmount.errors import BlobmountError


class WarmPathError(BlobmountError):
    """A PATH is outside the mount, or is not a file or folder in it."""


@dataclass(frozen=True, slots=True)
class WarmFile:
    path: str  # absolute
    rel: str  # relative to the mount's root, for messages
    size: int


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def resolve_targets(root: str, paths: Sequence[str]) -> list[str]:
    """Absolute, normalised paths inside `root` for `paths` (absolute, or relative to `root`);
    the whole of `root` when there are none. Paths inside another one given are dropped.

    Raises:
        WarmPathError: a path is empty or lies outside `root`.
    """
    root = os.path.normpath(os.path.abspath(root))
    out = []
    for raw in paths or ["."]:
        if not raw:
            raise WarmPathError("an empty PATH was given")
        # os.path.join keeps an absolute `raw` as it is; ".." is resolved by name, as a shell does
        path = os.path.normpath(os.path.join(root, raw))
        if not _inside(path, root):
            # maybe reached through a symlink to the mount (a stat, so only when needed)
            real, real_root = os.path.realpath(path), os.path.realpath(root)
            if not _inside(real, real_root):
                raise WarmPathError(f"{raw} is outside the mount {root}")
            path = os.path.join(root, os.path.relpath(real, real_root))
        out.append(os.path.normpath(path))
    return _outermost(out)


def _outermost(paths: list[str]) -> list[str]:
    kept: list[str] = []
    for path in sorted(set(paths)):  # a parent sorts before what is inside it
        if not any(_inside(path, outer) for outer in kept):
            kept.append(path)
    return kept


def check_targets(root: str, targets: Sequence[str]) -> None:
    """Each target exists and is a regular file or a folder.

    Raises:
        WarmPathError: naming the first one that is not.
    """
    for target in targets:
        rel = os.path.relpath(target, root)
        try:
            mode = os.stat(target).st_mode
        except FileNotFoundError:
            raise WarmPathError(f"{rel}: no such file or folder in the mount {root}") from None
        except OSError as exc:
            raise WarmPathError(f"{rel}: {exc.strerror or exc}") from None
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise WarmPathError(f"{rel} is neither a file nor a folder")


def walk(
    root: str, targets: Sequence[str], on_error: Callable[[str, OSError], None]
) -> Iterator[WarmFile]:
    """The regular files under `targets` (files given are yielded as they are). A folder or
    file that cannot be read is passed to `on_error` (with its path relative to `root`) and
    left out."""
    for target in targets:
        try:
            st = os.stat(target)
        except OSError as exc:
            on_error(os.path.relpath(target, root), exc)
            continue
        if stat.S_ISREG(st.st_mode):
            yield WarmFile(target, os.path.relpath(target, root), st.st_size)
        elif stat.S_ISDIR(st.st_mode):
            yield from _walk_folder(root, target, on_error)


def _walk_folder(
    root: str, top: str, on_error: Callable[[str, OSError], None]
) -> Iterator[WarmFile]:
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            on_error(os.path.relpath(folder, root), exc)
            continue
        subfolders = []
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    subfolders.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    size = entry.stat(follow_symlinks=False).st_size
                    yield WarmFile(entry.path, os.path.relpath(entry.path, root), size)
            except OSError as exc:
                on_error(os.path.relpath(entry.path, root), exc)
        stack.extend(reversed(subfolders))
