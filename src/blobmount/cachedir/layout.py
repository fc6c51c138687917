"""The cache directory's layout: hashed entry names, atomic fills, temporaries, locks, scans.

::

    DIR/
    ├── CACHEDIR.TAG          marks DIR as a cache (backup tools skip it; `cache clear` checks it)
    ├── .lock                 flock: shared by every live mount, exclusive by `cache clear`
    ├── .prune.lock           flock: one pruner at a time across processes
    └── <kind>/               "blocks" (block mode), later "files" (whole-file mode)
        └── <location id>/    16 hex digits of a hash of "account/container"
            ├── LOCATION      the location in clear text (for `cache info`), never a path
            └── <hh>/         first two hex digits of the entry name (256-way fan-out)
                ├── <entry>   40 hex digits: a hash of the entry's key parts
                └── .tmp-<pid>-<n>-<random>   a fill in progress (same folder, so rename is atomic)

Nothing from storage ever becomes a path: locations and keys are hashed. A fill is written to a
temporary name unique to this process and writer, then renamed over the final name, so a reader
sees either nothing or a whole file, and two processes filling the same entry at once each
rename a complete file. Temporaries of dead processes (a daemon killed mid-write) are removed by
the next scan. All functions here do blocking I/O: call them from a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import itertools
import logging
import os
import random
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

TAG_FILE = "CACHEDIR.TAG"
TAG_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This directory is a blobmount cache. Remove it with `blobmount cache clear`.\n"
    "# For information about cache directory tags see https://bford.info/cachedir/\n"
)
LOCK_FILE = ".lock"
PRUNE_LOCK_FILE = ".prune.lock"
LOCATION_FILE = "LOCATION"
TEMP_PREFIX = ".tmp-"
#: a temporary this old is removed even if its pid looks alive (pids get reused)
STALE_TEMP_AGE_S = 3600.0
#: the entry kinds a cache directory may hold; scans, pruning and `cache clear` touch nothing
#: else, so a cache pointed at a folder with other files in it never removes them
KINDS = ("blocks", "files")

_temp_counter = itertools.count()


def _hex_hash(parts: Sequence[str], digest_size: int) -> str:
    h = hashlib.blake2b(digest_size=digest_size)
    for part in parts:
        raw = part.encode("utf-8", "surrogatepass")
        # length-prefixed, so ("ab", "c") and ("a", "bc") never collide
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    return h.hexdigest()


def location_id(location: str) -> str:
    return _hex_hash((location,), 8)


def entry_name(parts: Sequence[str]) -> str:
    """The file name of an entry keyed by `parts` (160-bit hash, hex)."""
    return _hex_hash(parts, 20)


def entry_file(folder: str, parts: Sequence[str]) -> str:
    """The path of the entry keyed by `parts` in a location's folder (`location_dir`, as a
    string): `entry_in` on plain strings, for the whole-file cache's open (pathlib costs
    microseconds)."""
    name = entry_name(parts)
    return f"{folder}/{name[:2]}/{name}"


def entry_in(folder: Path, parts: Sequence[str]) -> Path:
    """The path of the entry keyed by `parts` in a location's folder (`location_dir`)."""
    return Path(entry_file(os.fspath(folder), parts))


def is_temporary(name: str) -> bool:
    return name.startswith(TEMP_PREFIX)


def temporary_owner(name: str) -> int | None:
    """The pid that created temporary `name`, if the name says so."""
    try:
        return int(name[len(TEMP_PREFIX) :].split("-", 1)[0])
    except ValueError:
        return None


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def temporary_path(final: Path) -> Path:
    """A temporary name next to `final`, unique across processes and writer threads."""
    return Path(temporary_name(os.fspath(final)))


def temporary_name(final: str) -> str:
    """`temporary_path` on plain strings (the block tier's hot path: pathlib costs microseconds).
    The pid and a counter make it unique among live processes; the random part keeps a reused
    pid from meeting a dead process's leftover (no syscall: uniqueness, not secrecy)."""
    n = next(_temp_counter)  # itertools.count is atomic under the GIL
    head = os.path.dirname(final)
    return f"{head}/{TEMP_PREFIX}{os.getpid()}-{n}-{random.getrandbits(32):08x}"


def allocated_bytes(st: os.stat_result) -> int:
    """Bytes a file occupies on disk, as `du` counts them."""
    return st.st_blocks * 512


def atomic_write(final: str | Path, parts: Sequence[bytes]) -> int:
    """Write the concatenation of `parts` to `final` through a temporary and a rename.

    No fsync: every cache entry is verified when read, so a file torn by a power loss is found
    and dropped then, and fsync per block would cost more than the refetch it could save.
    Returns the bytes the new file occupies. Raises OSError (the temporary is removed).
    """
    tmp = temporary_name(os.fspath(final))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(tmp, flags, 0o600)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(tmp), exist_ok=True)
        fd = os.open(tmp, flags, 0o600)
    try:
        try:
            _write_all(fd, parts)
            size = allocated_bytes(os.fstat(fd))
        finally:
            os.close(fd)
        os.rename(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return size


def _write_all(fd: int, parts: Sequence[bytes]) -> None:
    views = [memoryview(p) for p in parts if len(p)]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def write_text_once(path: Path, text: str) -> None:
    """Create `path` with `text` unless it exists (atomically, so readers never see half)."""
    if path.exists():
        return
    with contextlib.suppress(FileExistsError):
        atomic_write(path, [text.encode()])


def free_bytes(path: str | Path) -> tuple[int, int]:
    """(bytes free to us, allocation unit) of the file system holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_bsize or st.f_frsize or 4096


# -- locks --------------------------------------------------------------------------------


class DirLock:
    """An flock on a file in the cache directory. Released when closed or when the process
    dies (SIGKILL included), so a crashed mount never leaves the directory locked."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, *, shared: bool, wait_s: float = 0.0) -> bool:
        """Try to take the lock, retrying for up to `wait_s`. True if held."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, mode)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)
            else:
                self._fd = fd
                return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


# -- scans --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CacheEntry:
    path: str
    size_bytes: int  # allocated
    last_used_s: float  # mtime: set when written, touched when read
    kind: str
    location_id: str


@dataclass(slots=True)
class LocationUsage:
    location: str  # "account/container", from the LOCATION file ("?" if unreadable)
    entries: int = 0
    size_bytes: int = 0


@dataclass(slots=True)
class ScanResult:
    """Totals of one walk over the directory (the entries themselves go to `visit`)."""

    entries: int = 0
    entry_bytes: int = 0
    temporaries: int = 0  # live ones of other processes, left alone
    temporary_bytes: int = 0
    #: this process's writes in progress (its budget counts them as reserved, not as used)
    own_temporaries: int = 0
    temporaries_removed: int = 0
    #: (kind, location id) -> usage
    locations: dict[tuple[str, str], LocationUsage] = field(default_factory=dict)

    @property
    def used_bytes(self) -> int:
        return self.entry_bytes + self.temporary_bytes


class CacheLayout:
    """Paths inside one cache directory, and the blocking operations on them."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK_FILE

    @property
    def prune_lock_path(self) -> Path:
        return self.root / PRUNE_LOCK_FILE

    def location_dir(self, kind: str, location: str) -> Path:
        return self.root / kind / location_id(location)

    def is_cache(self) -> bool:
        """True if the directory carries blobmount's CACHEDIR.TAG."""
        try:
            return "blobmount" in (self.root / TAG_FILE).read_text(errors="replace")
        except OSError:
            return False

    def prepare(self, kind: str, location: str) -> None:
        """Create the directory (private to the user), its tag and the location's folder.

        Raises OSError when the directory cannot be used.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown cache kind {kind!r}")
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.is_cache():
            write_text_once(self.root / TAG_FILE, TAG_TEXT)
        folder = self.location_dir(kind, location)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_text_once(folder / LOCATION_FILE, location + "\n")

    def scan(
        self,
        visit: Callable[[CacheEntry], None] | None = None,
        *,
        remove_stale_temporaries: bool = True,
        now: float | None = None,
    ) -> ScanResult:
        """Walk every entry (calling `visit` with each) and total them up; stale temporaries
        (their process is gone, or older than an hour) are removed on the way. Memory does not
        grow with the number of entries."""
        result = ScanResult()
        now = time.time() if now is None else now
        for kind_dir in _subdirs(self.root):
            if kind_dir.name not in KINDS:
                continue
            for loc_dir in _subdirs(Path(kind_dir.path)):
                try:
                    text = (Path(loc_dir.path) / LOCATION_FILE).read_text(errors="replace")
                except OSError:
                    text = "?"
                usage = LocationUsage(text.strip() or "?")
                result.locations[(kind_dir.name, loc_dir.name)] = usage
                for fan_dir in _subdirs(Path(loc_dir.path)):
                    self._scan_leaf(
                        fan_dir.path,
                        (kind_dir.name, loc_dir.name),
                        usage,
                        result,
                        visit,
                        now,
                        remove_stale_temporaries,
                    )
        return result

    def entries(self) -> list[CacheEntry]:
        """Every entry, as a list (for tools and tests; `scan` with `visit` scales better)."""
        found: list[CacheEntry] = []
        self.scan(found.append, remove_stale_temporaries=False)
        return found

    @staticmethod
    def _scan_leaf(
        folder: str,
        key: tuple[str, str],
        usage: LocationUsage,
        result: ScanResult,
        visit: Callable[[CacheEntry], None] | None,
        now: float,
        remove_stale: bool,
    ) -> None:
        try:
            items = list(os.scandir(folder))
        except OSError:
            return
        for item in items:
            try:
                st = item.stat(follow_symlinks=False)
            except OSError:
                continue  # removed meanwhile
            if not stat.S_ISREG(st.st_mode):
                continue
            size = allocated_bytes(st)
            if is_temporary(item.name):
                owner = temporary_owner(item.name)
                stale = now - st.st_mtime > STALE_TEMP_AGE_S or (
                    owner is not None and owner != os.getpid() and not pid_alive(owner)
                )
                if remove_stale and stale:
                    with contextlib.suppress(OSError):
                        os.unlink(item.path)
                        result.temporaries_removed += 1
                        continue
                if owner == os.getpid():
                    result.own_temporaries += 1
                else:
                    result.temporaries += 1
                    result.temporary_bytes += size
                continue
            result.entries += 1
            result.entry_bytes += size
            usage.entries += 1
            usage.size_bytes += size
            if visit is not None:
                visit(CacheEntry(item.path, size, st.st_mtime, key[0], key[1]))

    def remove_entry(
        self, path: str, *, unless_used_after: float, keep: Callable[[Path], bool] | None
    ) -> int | None:
        """Remove an entry unless it was used (touched) after `unless_used_after` or `keep`
        says so. Returns the bytes freed, or None if the entry was spared."""
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return 0  # someone else removed it
        if st.st_mtime > unless_used_after:
            return None
        if keep is not None and keep(Path(path)):
            return None
        try:
            os.unlink(path)
        except FileNotFoundError:
            return 0
        return allocated_bytes(st)

    def clear(self) -> tuple[int, int]:
        """Remove every entry (all kinds, all locations). Returns (files, bytes) removed.
        The tag and lock files stay, so the directory remains a recognisable cache."""
        files = size = 0
        for kind_dir in _subdirs(self.root):
            if kind_dir.name not in KINDS:
                continue
            for root, dirs, names in os.walk(kind_dir.path, topdown=False):
                for name in names:
                    path = os.path.join(root, name)
                    with contextlib.suppress(OSError):
                        st = os.lstat(path)
                        os.unlink(path)
                        if name != LOCATION_FILE and not is_temporary(name):
                            files += 1
                        size += allocated_bytes(st)
                for name in dirs:
                    with contextlib.suppress(OSError):
                        os.rmdir(os.path.join(root, name))
            with contextlib.suppress(OSError):
                os.rmdir(kind_dir.path)
        return files, size


def _subdirs(path: Path) -> Iterator[os.DirEntry[str]]:
    try:
        items = list(os.scandir(path))
    except OSError:
        return
    for item in items:
        with contextlib.suppress(OSError):
            if item.is_dir(follow_symlinks=False):
                yield item
