"""Reading a folder through BlobFilesystem.readdir the way the kernel does: call after call,
from the offset the last accepted entry gave, until a call returns nothing."""

from __future__ import annotations


async def read_entries(fs, fh, start: int = 0):
    """Every (name, attr) from `start` on, as the kernel would collect them."""
    entries = []
    while True:
        got = []

        def reply(name, attr, next_id, got=got):
            got.append((name, attr, next_id))
            return True

        await fs.readdir(fh, start, reply)
        if not got:
            return entries
        entries += [(name, attr) for name, attr, _ in got]
        start = got[-1][2]
