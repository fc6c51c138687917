"""Per-process request counters of a multi-process mount, in one shared file (/dev/shm): one
row of uint64 per process, one column per kind of request, readable by the driver at any time.

A process increments only its own row, so no locking is needed; a reader may see a row a few
requests behind, which does not matter for shares of thousands of requests.
"""

from __future__ import annotations

import json
import mmap
import os

#: the kinds of request counted, in column order
OPS = ("lookup", "getattr", "open", "read", "release", "flush", "opendir", "readdir", "other")
OP_INDEX = {name: i for i, name in enumerate(OPS)}
MAX_PROCESSES = 16


class Counters:
    """The shared counters file, mapped; `row` is this process's row."""

    def __init__(self, path: str, create: bool, row: int = 0) -> None:
        size = MAX_PROCESSES * len(OPS) * 8
        flags = os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._cells = memoryview(self._map).cast("Q")
        self.path = path
        self.row = row

    def count(self, op: str) -> None:
        self._cells[self.row * len(OPS) + OP_INDEX[op]] += 1

    def rows(self, processes: int) -> list[dict[str, int]]:
        """Each process's counts so far, by op."""
        n = len(OPS)
        return [
            dict(zip(OPS, self._cells[r * n : (r + 1) * n], strict=True)) for r in range(processes)
        ]

    def dump(self) -> None:
        """Write this process's row to `<path>.<pid>.json` (at exit, or on SIGUSR1)."""
        row = self.rows(self.row + 1)[self.row]
        target = f"{self.path}.{os.getpid()}.json"
        with open(target + ".tmp", "w") as f:
            json.dump({"pid": os.getpid(), "row": self.row, "counts": row}, f)
        os.replace(target + ".tmp", target)

    def close(self) -> None:
        self._cells.release()
        self._map.close()


def remove_counters(path: str) -> None:
    """Delete the counters file and the JSON copies the processes wrote."""
    folder, base = os.path.split(path)
    for name in os.listdir(folder or "."):
        if name == base or (name.startswith(base + ".") and name.endswith(".json")):
            try:
                os.unlink(os.path.join(folder, name))
            except FileNotFoundError:
                pass
