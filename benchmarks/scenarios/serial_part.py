"""The serial part of a mount over one run (issue #25), from the per-process figures that
`blobmount stats --json` lists before and after it (`processes`: each process's FUSE requests,
bytes served, CPU and time under the mount-wide locks).

Amdahl's serial part is the work that does not spread when processes are added. In a mount of
several processes the kernel hands each request to whichever process reads it first, so the
request path spreads by construction; what does not is:

- what the main process does besides its share of the reading (the stats, hints and metrics
  sockets, the zygote). Measured as the main process's CPU beyond what its share of the work
  costs the other processes: main CPU - main work x (others' CPU / others' work). The work is
  counted in requests for small files (each costs about the same) and in bytes served for large
  ones (a READ of a handle another process opened is passed to that process, fs/forward.py,
  whose bytes they become). Noisy: the kernel does not deal the kinds of requests out evenly,
  so the figure may come out below zero; the report shows it as measured, and the serial part
  counts it as 0 then;
- the time any process holds a lock all of them take in turn (the open-versions table at every
  open and release, the log of inode names at every new name): while one holds it, the others
  that need it wait.

With one process, or where one process did all the work (one reader's stream of a large file is
read ahead and served by the process that opened it, which may be a worker), all of that
process's CPU is serial.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

#: how the work of a run is counted: requests (small files) or bytes served (large files)
WorkUnit = Literal["requests", "bytes"]


@dataclass(frozen=True, slots=True)
class ProcessDelta:
    """What one process did between two snapshots."""

    pid: int
    main: bool
    #: requests whose work it did: those it took from the kernel, less those it passed on to
    #: another process, plus those passed to it
    requests: int
    bytes_served: int
    cpu_s: float
    shared_lock_s: float

    def work(self, unit: WorkUnit) -> int:
        return self.requests if unit == "requests" else self.bytes_served


@dataclass(frozen=True, slots=True)
class SerialPart:
    """The serial part of one run, in seconds over the run (divide by its files or GiB)."""

    processes: int
    #: the main process's share of the work (1.0: one process did it all, maybe a worker)
    main_share: float
    #: its CPU beyond what its work would have cost the other processes (may be < 0); where
    #: one process did all the work, that process's whole CPU
    main_extra_s: float
    #: time every process spent holding the mount-wide locks
    locks_s: float

    @property
    def total_s(self) -> float:
        return max(self.main_extra_s, 0.0) + self.locks_s


def process_deltas(
    before: dict[str, Any] | None, after: dict[str, Any] | None
) -> list[ProcessDelta]:
    """Each process listed after the run, less what it had before (a process started during the
    run, a replaced worker, counts from zero); [] if either snapshot has no process list."""
    if not before or not after or not after.get("processes") or not before.get("processes"):
        return []
    was = {p["pid"]: p for p in before["processes"]}
    deltas = []
    for now in after["processes"]:
        old = was.get(now["pid"], {})

        def grew(key: str, now: dict[str, Any] = now, old: dict[str, Any] = old) -> Any:
            return now[key] - old.get(key, 0)

        deltas.append(
            ProcessDelta(
                pid=now["pid"],
                main=bool(now["main"]),
                requests=grew("requests") - grew("passed_on") + grew("answered_for_others"),
                bytes_served=grew("bytes_served"),
                cpu_s=grew("cpu_s"),
                shared_lock_s=grew("shared_lock_s"),
            )
        )
    return deltas


def serial_part(deltas: list[ProcessDelta], unit: WorkUnit) -> SerialPart | None:
    """The run's serial part; None without a main process, or with no work done."""
    main = [d for d in deltas if d.main]
    others = [d for d in deltas if not d.main]
    working = [d for d in deltas if d.work(unit) > 0]
    if len(main) != 1 or not working:
        return None
    (first,) = main
    locks = sum(d.shared_lock_s for d in deltas)
    if len(working) == 1:  # one process, or one stream: whoever opened it did it all
        return SerialPart(len(deltas), 1.0, working[0].cpu_s, locks)
    other_work = sum(d.work(unit) for d in others)
    per_unit = sum(d.cpu_s for d in others) / other_work
    share = first.work(unit) / (first.work(unit) + other_work)
    return SerialPart(len(deltas), share, first.cpu_s - first.work(unit) * per_unit, locks)
