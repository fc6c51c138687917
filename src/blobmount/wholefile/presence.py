"""Which whole-file cache entries may be on disk, known without a system call.

A cold open would otherwise look for its entry on disk first, and that failed `open` was the
costliest step left on the FUSE loop's thread (measured: about 0.19 ms a file with 16 readers,
nearly all of it waiting to win the GIL back from the storage client's thread, against a few
microseconds alone). A Bloom filter over entry names answers "certainly not there" for a
version never cached, so its open goes straight to its GET; "maybe there" is checked on disk
as before.

It learns the entries of an earlier mount from one scan of the location's folder (in a worker
thread, at start; until it ends, every open looks on disk), and every entry this process
writes or finds. An entry another process of the same mount writes is not in it; the cache
looks for those in the mount's shared record (`multiproc.whole_file_copies`). Entry names are
already uniform hashes, so the filter's bit positions are slices of the name. 2 MiB of bits
with 4 probes: about 0.2% false "maybe" at a million entries.
"""

from __future__ import annotations

import logging
import os

from blobmount.cachedir.layout import is_temporary

log = logging.getLogger(__name__)

BITS = 1 << 24
PROBES = 4
_HEX_PER_PROBE = 6  # 24 bits of the name per probe


def _positions(name: str) -> list[int]:
    return [
        int(name[i * _HEX_PER_PROBE : (i + 1) * _HEX_PER_PROBE], 16) & (BITS - 1)
        for i in range(PROBES)
    ]


class PresenceFilter:
    """A Bloom filter of entry names (40 hex digits); single-threaded except `scan_folder`,
    which builds a filter of its own in a worker thread for `merge`."""

    def __init__(self) -> None:
        self._bits = bytearray(BITS // 8)
        #: False until the scan of the folder has been merged: everything may be there
        self.complete = False

    def add(self, name: str) -> None:
        bits = self._bits
        for pos in _positions(name):
            bits[pos >> 3] |= 1 << (pos & 7)

    def may_hold(self, name: str) -> bool:
        if not self.complete:
            return True
        bits = self._bits
        return all(bits[pos >> 3] & (1 << (pos & 7)) for pos in _positions(name))

    def merge(self, other: PresenceFilter) -> None:
        """Take in what `other` holds (a scan's filter), and count this filter complete."""
        size = len(self._bits)
        merged = int.from_bytes(self._bits, "little") | int.from_bytes(other._bits, "little")
        self._bits = bytearray(merged.to_bytes(size, "little"))
        self.complete = True


def scan_folder(folder: str | os.PathLike[str]) -> PresenceFilter:
    """(worker thread) A filter of the entries in a location's folder (`<hh>/<name>`)."""
    found = PresenceFilter()
    try:
        fanout = list(os.scandir(folder))
    except FileNotFoundError:
        return found
    for sub in fanout:
        if not sub.is_dir(follow_symlinks=False):
            continue
        try:
            with os.scandir(sub.path) as names:
                for entry in names:
                    if not is_temporary(entry.name) and len(entry.name) == 40:
                        found.add(entry.name)
        except OSError as exc:
            log.debug("cannot list %s: %s", sub.path, exc)
    return found
