"""Cache files written with no name until they are whole: open(2)'s O_TMPFILE, then linkat.

The other way to publish a file atomically, a named temporary renamed over the final name, makes
the file system insert a directory entry, then rename it. An unnamed file gets one directory
entry, when it is linked under its final name: create, write and publish of a 25 KB entry took
52-75 µs of CPU against 58-102 µs on this project's journaled ext4 (docs/developer-notes/
concurrency.md, "Whole-file entries"). A crash leaves
nothing behind either: the kernel frees an unnamed inode that was never linked, so there is no
temporary for the next scan to remove.

Linking goes through the fd's link in /proc/self/fd (linkat with AT_SYMLINK_FOLLOW), which any
user may do; the AT_EMPTY_PATH form needs CAP_DAC_READ_SEARCH. A file system without O_TMPFILE
(some network and FUSE file systems) or a process without /proc makes `open_unnamed` return
None: the caller then writes a named temporary instead, and this process does not ask again.
"""

from __future__ import annotations

import contextlib
import errno
import os

from blobmount.cachedir.layout import temporary_name

_FLAGS = os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC
#: what open(2) answers where O_TMPFILE cannot be used: EOPNOTSUPP (the file system), EISDIR (a
#: kernel that predates it reads the flag as O_DIRECTORY), EINVAL
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL)


def _open_proc() -> int | None:
    # "/proc", not "/proc/self": "self" is looked up at each link, so a forked child's links
    # name its own fds through the fd it inherited
    try:
        return os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None


_PROC = _open_proc()
#: whether this process still tries unnamed files (cleared on the first refusal)
_usable = _PROC is not None and os.path.isdir("/proc/self/fd")


def usable() -> bool:
    """Whether `open_unnamed` may still give a file (False once the file system refused)."""
    return _usable


def open_unnamed(folder: str) -> int | None:
    """A read-write fd of a new unnamed file in `folder` (made if missing), or None where the
    file system or the process cannot have one. Close it when done; unless `link_into_place`
    named it, closing frees it."""
    global _usable
    if not _usable:
        return None
    try:
        try:
            return os.open(folder, _FLAGS, 0o600)
        except FileNotFoundError:  # an entry's fan-out folder is made on first use
            os.makedirs(folder, exist_ok=True)
            return os.open(folder, _FLAGS, 0o600)
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise
        _usable = False
        return None


def link_into_place(fd: int, final: str) -> None:
    """Name the unnamed file `fd` `final`, replacing a file of that name if there is one.

    Raises OSError (no name is left behind then)."""
    # linkat(AT_SYMLINK_FOLLOW) of the fd's /proc link; os.link calls plain link(), which does
    # not follow it, unless it is given a dir fd
    source = f"self/fd/{fd}"
    try:
        os.link(source, final, src_dir_fd=_PROC, follow_symlinks=True)
        return
    except FileExistsError:
        pass
    # rare (two writers of one entry): link under a temporary name and rename over the other
    tmp = temporary_name(final)
    os.link(source, tmp, src_dir_fd=_PROC, follow_symlinks=True)
    try:
        os.rename(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
