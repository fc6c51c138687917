"""The destination folder on local disk: its lock, its temp area, and moving files into place.

Every file is written under DEST/.blobmount-download.tmp/ with a numbered name and renamed to
its final path only when complete, so a final name never holds a partial file. The temp area is
emptied when a run starts (a killed run leaves its pieces there) and removed when it ends.

The functions here block (file system calls): the downloader calls them from worker threads,
except `PartFile.discard`, which also runs during cancellation (see there).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import itertools
import logging
import os
import shutil
import stat
from pathlib import Path

from blobmount.download_mode.direct_io import DirectWrites, RefusedError
from blobmount.errors import BlobmountError

log = logging.getLogger(__name__)

TMP_DIR_NAME = ".blobmount-download.tmp"
_HASH_CHUNK = 8 * 1024 * 1024


class DestinationError(BlobmountError):
    """The destination folder cannot be used (not a folder, not writable, in use)."""


class Destination:
    """DEST, locked for this process (one download per destination at a time)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp_dir = path / TMP_DIR_NAME
        self._fd: int | None = None
        self._names = itertools.count()

    def open(self) -> None:
        """Create DEST if needed, lock it, and empty the temp area.

        Raises:
            DestinationError: DEST is not a folder, cannot be created, or another download
                into it is running.
        """
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except NotADirectoryError:
            raise DestinationError(f"{self.path} exists and is not a folder") from None
        except FileExistsError:
            raise DestinationError(f"{self.path} exists and is not a folder") from None
        except OSError as exc:
            raise DestinationError(f"cannot use {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DestinationError(
                f"another blobmount download into {self.path} is running"
            ) from None
        self._fd = fd
        try:
            if self.tmp_dir.exists():
                shutil.rmtree(self.tmp_dir)
            self.tmp_dir.mkdir()
        except OSError as exc:
            self.close()
            raise DestinationError(f"cannot use {self.path}: {exc.strerror}") from None

    def close(self) -> None:
        """Remove the temp area and release the lock. Idempotent."""
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # releases the flock

    def temp_path(self) -> Path:
        return self.tmp_dir / f"{next(self._names)}.part"

    def sync(self) -> None:
        """Make everything written to DEST's file system so far durable (syncfs(2))."""
        if self._fd is None:
            raise RuntimeError("destination not open")
        sync_filesystem(self._fd)

    def make_folder(self, rel: str) -> None:
        """Create the folder DEST/rel (and its parents)."""
        if rel:
            (self.path / rel).mkdir(parents=True, exist_ok=True)

    def stat_file(self, rel: str) -> os.stat_result | None:
        """The stat of DEST/rel if it is a regular file (symlinks not followed), else None."""
        try:
            st = os.lstat(self.path / rel)
        except OSError:
            return None
        return st if stat.S_ISREG(st.st_mode) else None


_libc: ctypes.CDLL | None = None

#: sync_file_range(2)'s flag to start writeback of dirty pages without waiting for it
SYNC_FILE_RANGE_WRITE = 2


def libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def start_writeback(fd: int, offset: int, length: int) -> bool:
    """Ask the kernel to start writing `length` bytes at `offset` of `fd` to disk, without
    waiting; True if it took the request. The final syncfs then finds most pages written, so
    the disk works while the network does, not after it (measured: syncfs took a third of a
    512 MiB download's time). Not for the whole-file cache, which never syncs: there it made
    opens about 20% slower (measured; the cause not found). Best effort: where refused, syncfs
    does all the work."""
    call = getattr(libc(), "sync_file_range", None)
    if call is None:
        return False
    status: int = call(fd, ctypes.c_int64(offset), ctypes.c_int64(length), SYNC_FILE_RANGE_WRITE)
    return status == 0


def sync_filesystem(fd: int) -> None:
    """syncfs(2) on the file system holding `fd` (os.sync() where syncfs is missing).

    One syncfs per checkpoint costs far less than an fsync per file when there are many files.
    """
    syncfs = getattr(libc(), "syncfs", None)
    if syncfs is None:
        os.sync()
        return
    if syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def file_md5(path: Path) -> bytes:
    """MD5 of a whole local file, read in 8 MiB chunks."""
    digest = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.digest()


class PartFile:
    """One temp file being filled, then moved to its final name by `commit`."""

    def __init__(
        self,
        path: Path,
        size: int,
        *,
        preallocate: bool,
        writeback: bool = True,
        direct: DirectWrites | None = None,
    ) -> None:
        """Create the temp file (O_EXCL). With `preallocate`, reserve `size` bytes now: parts
        then land in place with pwrite, and a full disk fails here, before any download. With
        `writeback`, each write through the page cache starts its writeback at once
        (`start_writeback`). With `direct`, the aligned middle of each write goes around the
        page cache (`direct_io`) where the file is large enough and its file system allows."""
        self.path: Path | None = path
        self.size = size
        self._writeback = writeback
        self._direct = direct
        self._direct_fd: int | None = None
        self._direct_refused = False
        # 0o666 and the umask, like any file a program creates (mkstemp would force 0600)
        self._fd: int | None = os.open(
            path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666
        )
        try:
            if preallocate and size > 0:
                try:
                    os.posix_fallocate(self._fd, 0, size)
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                        raise
                    os.ftruncate(self._fd, size)  # file system without fallocate: sparse is fine
            if direct is not None:
                self._direct_fd = direct.open(path, size)
        except BaseException:
            self.discard()
            raise

    def _require_fd(self) -> int:
        if self._fd is None:
            raise RuntimeError("temp file already closed")
        return self._fd

    def write_at(self, offset: int, data: bytes) -> None:
        fd = self._require_fd()
        view = memoryview(data)
        skip, size = self._write_direct(offset, view)
        if size:
            # the unaligned ends, through the page cache
            self._write_buffered(fd, offset, view[:skip])
            self._write_buffered(fd, offset + skip + size, view[skip + size :])
        else:
            self._write_buffered(fd, offset, view)

    def _write_direct(self, offset: int, view: memoryview) -> tuple[int, int]:
        """The span of `view` written with O_DIRECT ((0, 0) if none; see DirectWrites.write)."""
        direct, direct_fd = self._direct, self._direct_fd
        if direct is None or direct_fd is None or self._direct_refused:
            return 0, 0
        try:
            return direct.write(direct_fd, offset, view)
        except RefusedError as exc:
            # Stop using it, but keep it open until commit or discard: other parts of this
            # file may be writing through it in other threads, and a closed descriptor's
            # number can be reused at once by another file.
            if not self._direct_refused:
                self._direct_refused = True
                direct.refused(self.path, exc)
            return 0, 0

    def _write_buffered(self, fd: int, offset: int, view: memoryview) -> None:
        if not view:
            return
        start, length = offset, len(view)
        while view:
            written = os.pwrite(fd, view, offset)
            view = view[written:]
            offset += written
        if self._writeback:
            start_writeback(fd, start, length)

    def _close_direct(self) -> None:
        fd, self._direct_fd = self._direct_fd, None
        _close_quietly(fd)

    def commit(self, final: Path, mtime_s: float) -> int:
        """Set the mtime to `mtime_s`, close, and rename onto `final` (creating its folder).
        Returns the final file's st_mtime_ns."""
        fd = self._require_fd()
        ns = int(mtime_s * 1e9)
        os.utime(fd, ns=(ns, ns))
        mtime_ns = os.fstat(fd).st_mtime_ns  # the file system may round what we set
        self._close_direct()
        self._fd = None
        os.close(fd)
        src = self.path
        assert src is not None
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(src, final)
        self.path = None
        return mtime_ns

    def discard(self) -> None:
        """Close and delete the temp file, if still there. Plain syscalls, no await: it must
        run even while the task is being cancelled. Never raises."""
        self._close_direct()
        fd, self._fd = self._fd, None
        _close_quietly(fd)
        path, self.path = self.path, None
        if path is not None:
            try:
                os.unlink(path)
            except OSError:
                pass


def _close_quietly(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
