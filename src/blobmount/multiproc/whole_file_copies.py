"""Whole-file copies shared by the processes of a multi-process mount: each version is
downloaded once for the mount, whichever process an open of it lands in.

The processes share the cache folder, but each process's whole-file cache keeps its own
knowledge of it: the downloads it runs, the entries it wrote or checked, and a presence filter
that says "certainly not on disk" for versions it never saw. Without this module, an open in one
process of a version the other downloaded found nothing (its filter said "not there") and
downloaded it again: with 2 processes a second epoch downloaded about half the files again, and
an open landing in one process while the other downloaded the same version (a job's open racing
the main process's hinted download of it) downloaded it twice.

So, per version (named by its entry, a hash of blob name and ETag):

- a process about to download it claims it (`claims`: a file in the mount's shared
  folder, holding its pid); a process that finds it claimed waits until the claimer has the
  entry on disk under its final name, then opens that. A claim ends when the entry is written
  (for a small file, after the open that downloaded it was answered from memory), or when the
  download fails, does not fit or is abandoned; a waiter then downloads it itself.
- a process records each entry it wrote in a set of its own (`multiproc.key_set`, 64 bits of
  the entry's name; one writer per set, so no lock), and every process looks in all of them
  before downloading. An entry recorded there was written by this mount from checked bytes, so
  it is used without checking its Content-MD5 again (its size is still checked).

Records are never withdrawn: an entry pruned since is simply not found on disk, and the open
downloads it. A set whose window is full records nothing more (each holds about
`TOTAL_SLOTS / processes` keys): an entry written then is found by the others as an entry of
an earlier mount, checked once per process (a Get Blob Properties and an MD5), never downloaded
again.
"""

from __future__ import annotations

from pathlib import Path

from blobmount.claims import Claim, claimed_result, make_claim, release
from blobmount.multiproc.key_set import SharedKeySet

FOLDER = "whole-files"
#: slots of all the processes' sets together (8 bytes each, in /dev/shm)
TOTAL_SLOTS = 1 << 20
#: slots of one process's set, at least and at most
MIN_SLOTS, MAX_SLOTS = 1 << 16, 1 << 19
#: the longest an open waits for another process's download of the same version before it
#: downloads the version itself (storage timeouts and retries end a download well before)
CLAIM_WAIT_S = 600.0


def entry_key(entry: str) -> int:
    """An entry's key: 64 bits of its name, which is already a uniform hash (40 hex digits)."""
    return int(entry[:16], 16) | 2


class SiblingCopies:
    """The processes' shared record of whole-file entries (see the module's docstring). Create
    it before forking; `bind` it in each process."""

    def __init__(self, folder: Path, written: list[SharedKeySet]) -> None:
        self._folder = folder
        self._written = written
        self._mine: SharedKeySet | None = None

    @classmethod
    def create(cls, folder: Path, processes: int) -> SiblingCopies:
        claims = folder / FOLDER
        claims.mkdir(mode=0o700, exist_ok=True)
        slots = min(MAX_SLOTS, max(MIN_SLOTS, TOTAL_SLOTS // max(1, processes)))
        written = [SharedKeySet.create(folder / f"written-{i}", slots) for i in range(processes)]
        return cls(claims, written)

    def bind(self, index: int) -> None:
        """This process records what it writes in set `index` (its predecessor's, if it
        replaced one: those entries are still on disk)."""
        self._mine = self._written[index]

    def close(self) -> None:
        for keys in self._written:
            keys.close()

    def wrote(self, entry: str) -> bool:
        """Whether a process of this mount wrote `entry` (it may have been pruned since)."""
        key = entry_key(entry)
        return any(keys.holds(key) for keys in self._written)

    def record(self, entry: str) -> None:
        """This process wrote `entry` under its final name, from checked bytes."""
        if self._mine is not None:
            self._mine.add(entry_key(entry))

    def claim(self, entry: str) -> Claim:
        return make_claim(self._claim_path(entry))

    def release(self, entry: str) -> None:
        release(self._claim_path(entry))

    async def wait(self, entry: str) -> bool:
        """Wait for the process that claimed `entry` to be done: True if it wrote the entry."""
        written = await claimed_result(
            self._claim_path(entry),
            lambda: True if self.wrote(entry) else None,
            CLAIM_WAIT_S,
            "a whole-file download",
        )
        return bool(written)

    def _claim_path(self, entry: str) -> Path:
        return self._folder / entry
