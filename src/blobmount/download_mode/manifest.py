"""The download manifest: which local files are complete copies of which blob versions.

Kept outside DEST, so that after a download DEST holds exactly the prefix's files: one file per
source and destination (`manifest_path`) in a folder the caller chooses (the CLI and the API use
$XDG_STATE_HOME/blobmount/downloads). A manifest an older version left inside DEST
(DEST/.blobmount-download.db) is moved there on first use, so its download still resumes.

It is an SQLite database (stdlib, one file), rather than a JSON document or extended attributes:

- memory stays bounded for millions of files (a JSON manifest must be held and rewritten whole;
  SQLite answers indexed lookups from disk and appends in transactions);
- every checkpoint is one transaction, so a crash leaves the previous state, never a torn file;
- it works on any local file system (user xattrs are missing on some, and are lost by `cp`).

One row per local file: the blob it came from (storage location + name), the blob's size, ETag
and last-modified time, the local file's mtime (nanoseconds, set to the blob's last-modified
when written), and whether its Content-MD5 was checked. A row is written only after the file
is complete under its final name *and* durable (see `Downloader`'s checkpoints), so a row
never vouches for bytes a crash could lose. A rerun skips a blob when its row matches the
listing (same source, ETag and size) and the local file still has the recorded size and mtime.

All methods block: call them from a worker thread. One connection, guarded by a lock.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: the manifest's name inside DEST, where versions before 0.2 kept it (and where a Downloader
#: given no other place keeps it)
MANIFEST_NAME = ".blobmount-download.db"
_SCHEMA_VERSION = 1
#: SQLite's historical limit on '?' parameters in one statement is 999
_LOOKUP_BATCH = 500


def manifest_path(folder: Path, source: str, dest: Path) -> Path:
    """Where the manifest of copying `source` (a URI without secrets) to `dest` is kept in
    `folder`: a name people can place (the destination's), made unique by a hash of both."""
    dest_text = os.path.abspath(dest)
    key = hashlib.sha256(f"{source}\n{dest_text}".encode()).hexdigest()[:16]
    slug = dest_text.strip("/").replace("/", "_") or "root"
    return folder / f"{slug[-60:]}-{key}.db"


@dataclass(frozen=True, slots=True)
class Record:
    path: str  # relative to DEST, '/'-separated
    source: str  # "<storage location>/<blob name>"
    size: int
    etag: str
    last_modified: float
    mtime_ns: int  # the local file's st_mtime_ns after it was written
    md5_verified: bool


class Manifest:
    """An open manifest database. Use `Manifest.open(dest, path)`; `close()` when done."""

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self._db = connection
        self.path = path
        self._lock = threading.Lock()

    @classmethod
    def open(cls, dest: Path, path: Path | None = None) -> Manifest:
        """Open (or create) the manifest of downloads into `dest`, kept at `path` (default:
        inside `dest`, as MANIFEST_NAME). A manifest left inside `dest` by an older version is
        moved to `path` first. A corrupt or foreign file is moved aside and a new one started:
        that only costs re-downloading, never wrong data.

        Raises:
            OSError: `path`'s folder cannot be made, or the old manifest cannot be moved.
        """
        if path is None:
            path = dest / MANIFEST_NAME
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            _adopt_legacy(dest / MANIFEST_NAME, path)
        try:
            return cls(cls._connect(path), path)
        except sqlite3.DatabaseError as exc:
            aside = path.with_name(path.name + ".corrupt")
            log.warning("manifest %s is unreadable (%s); moved to %s", path, exc, aside.name)
            path.replace(aside)
            return cls(cls._connect(path), path)

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        # check_same_thread=False: trio's worker threads differ per call; our lock serialises.
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, _SCHEMA_VERSION):
                raise sqlite3.DatabaseError(f"unknown manifest version {version}")
            db.execute(
                "CREATE TABLE IF NOT EXISTS files ("
                " path TEXT PRIMARY KEY, source TEXT NOT NULL, size INTEGER NOT NULL,"
                " etag TEXT NOT NULL, last_modified REAL NOT NULL, mtime_ns INTEGER NOT NULL,"
                " md5_verified INTEGER NOT NULL) WITHOUT ROWID"
            )
            db.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
            # the default rollback journal works on every file system (WAL does not on NFS);
            # FULL makes each checkpoint durable once commit returns
            db.execute("PRAGMA synchronous = FULL")
        except BaseException:
            db.close()
            raise
        return db

    def lookup(self, paths: Sequence[str]) -> dict[str, Record]:
        """The records of those of `paths` that have one."""
        found: dict[str, Record] = {}
        with self._lock:
            for i in range(0, len(paths), _LOOKUP_BATCH):
                batch = paths[i : i + _LOOKUP_BATCH]
                marks = ",".join("?" * len(batch))
                rows = self._db.execute(
                    "SELECT path, source, size, etag, last_modified, mtime_ns, md5_verified"
                    f" FROM files WHERE path IN ({marks})",
                    batch,
                )
                for row in rows:
                    found[row[0]] = Record(
                        row[0], row[1], row[2], row[3], row[4], row[5], bool(row[6])
                    )
        return found

    def save(self, records: Iterable[Record]) -> int:
        """Insert or replace `records` in one transaction. Returns how many."""
        rows = [
            (r.path, r.source, r.size, r.etag, r.last_modified, r.mtime_ns, int(r.md5_verified))
            for r in records
        ]
        if not rows:
            return 0
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT OR REPLACE INTO files VALUES (?,?,?,?,?,?,?)", rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return len(rows)

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM files").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _adopt_legacy(old: Path, new: Path) -> None:
    """Move a manifest an older version kept inside DEST to its new place. If the new place
    has one already, that one is the later: the old one is removed."""
    if not old.is_file():
        return
    # SQLite's journal goes along (a crash mid-transaction leaves it, to roll back from)
    pairs = [
        (old, new),
        (old.with_name(old.name + "-journal"), new.with_name(new.name + "-journal")),
    ]
    if new.exists():
        for stale, _ in pairs:
            stale.unlink(missing_ok=True)
        log.info("removed an older download manifest from the destination: %s", old)
        return
    for src, dst in pairs:
        if src.exists():
            shutil.move(src, dst)  # copies when the state folder is on another file system
    log.info("moved the download manifest out of the destination, to %s", new)
