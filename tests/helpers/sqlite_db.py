"""A small SQLite database as bytes, to store as a blob and query through a mount."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path


def sqlite_bytes(folder: Path, rows: int, value: Callable[[int], str], *, index: bool) -> bytes:
    """Table t(id, v) with ids 0..rows-1 and v = value(id); an index on v if asked."""
    path = folder / "src.db"
    con = sqlite3.connect(path)
    con.execute("create table t (id integer primary key, v text)")
    con.executemany("insert into t values (?, ?)", [(i, value(i)) for i in range(rows)])
    if index:
        con.execute("create index t_v on t (v)")
    con.commit()
    con.close()
    return path.read_bytes()
