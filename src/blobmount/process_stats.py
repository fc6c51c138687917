"""The figures of a mount served by several processes, added up for the one process that reports.

Every process of the mount has its own storage client, block manager, caches and flow controller,
so each one's `MountSnapshot` describes only its part. `blobmount stats`, the metrics endpoint and
the API are served by the main process, which must therefore report the whole: each worker writes
its snapshot to `stats-<pid>.json` in the mount's shared folder about once a second
(`publish_every`), and the main process adds them to its own live one (`StatsShare.combined`).
The files are `MountSnapshot.to_json`, read back with `from_json`: no second format to keep in
step. A file is replaced whole (`os.replace` of a finished temporary), so a reader never sees half
of one.

How each figure adds up is a property of what it means, so every figure is named in one table,
`FIELDS` (a unit test fails when a statistics dataclass gains a field it does not name):

- COUNTER, a total since the process started (requests, bytes, hits, errors...): the sum over
  every file, including those of processes that have died since (a replaced worker's last
  figures), so a total never goes backwards when a worker is replaced. A dict of counts (storage
  errors by kind) is summed key by key.
- GAUGE, the state now (in flight, open, held in memory, queued): the sum over the processes still
  alive (`os.kill(pid, 0)`). A dead process's file is kept for its counters, not its gauges.
- SHARE, one process's share of a memory budget that `daemon_processes.process_share` divides
  between the processes: the sum over the live processes is the mount's budget, the figure its
  gauges are measured against (the main process's alone would be 1/N of it).
- PEAK, a high-water mark: the highest of any process's, dead or alive.
- EACH, a list of one entry per process (`processes`: each one's requests and CPU): the main
  process's own entries followed by those of the other live processes.
- MAIN, a setting, a limit each process applies on its own, a state (breaker, disk full), an
  identity (source, pid, uptime), or one process's view of state they all share (the disk
  cache's usage: one folder every process scans): the main process's own value. Summing those
  would multiply them by N. A field the table does not name is treated so too: never summed.

A section that is None in the main process's snapshot (a tier that is off) stays None; another
process's missing section is skipped. A reused pid (a dead worker's number given to a new
process) would overwrite the old file: with pids cycling through hundreds of thousands that is
accepted, not guarded against.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import os
import signal
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import trio

from blobmount.blocks.disk_tier import DiskTierStats
from blobmount.blocks.disk_writer import DiskWriterStats
from blobmount.blocks.fetcher import FetcherStats
from blobmount.blocks.hinted import HintedBlockStats
from blobmount.blocks.inline_reads import InlineReadStats
from blobmount.blocks.manager import BlockManagerStats
from blobmount.blocks.ram_tier import RamTierStats
from blobmount.cachedir.pruner import PrunerStats
from blobmount.fs.filesystem import NamespaceStats
from blobmount.hints.coordinator import HintStats
from blobmount.namespace.catalog import CatalogStats
from blobmount.runstate import pid_alive
from blobmount.snapshot import MountSnapshot, SnapshotFormatError
from blobmount.storage.counting import StorageStats
from blobmount.storage.flow import FlowStats
from blobmount.storage.retry import RetryStatistics
from blobmount.wholefile.cache import WholeFileStats

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

log = logging.getLogger(__name__)

PREFIX = "stats-"
SUFFIX = ".json"


class Kind(enum.Enum):
    """How one figure of the processes adds up to the mount's (see the module docstring)."""

    COUNTER = "summed over every process, dead ones included"
    GAUGE = "summed over the live processes"
    SHARE = "summed over the live processes (a divided budget)"
    PEAK = "the highest of every process's"
    EACH = "one entry per live process"
    MAIN = "the main process's own"


_C, _G, _S, _P, _M = Kind.COUNTER, Kind.GAUGE, Kind.SHARE, Kind.PEAK, Kind.MAIN
_E = Kind.EACH

#: every figure of every statistics dataclass in a MountSnapshot (nested sections are walked,
#: not listed); a test checks that this names each field of each of them, and nothing else
FIELDS: Final[Mapping[type, Mapping[str, Kind]]] = {
    MountSnapshot: {
        **dict.fromkeys(("source", "mountpoint", "pid", "uptime_s"), _M),
        **dict.fromkeys(("throughput_bytes_per_s", "open_files", "inodes"), _G),
        "processes": _E,
    },
    # inodes: entries of each process's own table (an inode two processes know counts twice)
    NamespaceStats: {
        **dict.fromkeys(("inodes", "open_files", "open_dirs"), _G),
        **dict.fromkeys(
            (
                *("forwarded_reads", "forward_failures", "forwarded_in_area", "forwarded_opens"),
                "shelf_opens",
                "notices_lost",
            ),
            _C,
        ),
    },
    CatalogStats: {
        "mode": _M,
        **dict.fromkeys(("listings", "negative_entries"), _G),
        **dict.fromkeys(("paged_pages", "walks", "walk_pages"), _C),
    },
    StorageStats: dict.fromkeys(
        ("list_requests", "properties_requests", "range_requests", "range_bytes", "errors"), _C
    ),
    RetryStatistics: dict.fromkeys(("retries", "gave_up"), _C),
    BlockManagerStats: {
        **dict.fromkeys(
            (
                *("reads", "bytes_served", "buffer_hits", "hinted_hits", "ram_hits"),
                *("storage_waits", "storage_wait_s", "prefetch_started", "prefetch_used"),
                *("prefetch_wasted", "prefetch_skipped_budget"),
            ),
            _C,
        ),
        **dict.fromkeys(("read_ahead_bytes", "open_handles"), _G),
        "read_ahead_budget_bytes": _S,
    },
    RamTierStats: {
        "capacity_bytes": _S,
        **dict.fromkeys(("used_bytes", "entries"), _G),
        **dict.fromkeys(("hits", "misses", "evictions"), _C),
    },
    FetcherStats: {
        **dict.fromkeys(("in_flight", "queued"), _G),
        **dict.fromkeys(
            (
                *("demand_fetches", "prefetches", "promoted", "fetched_bytes", "disk_hits"),
                *("failed", "coalesced"),
            ),
            _C,
        ),
    },
    HintedBlockStats: {
        **dict.fromkeys(("held_bytes", "held_blocks", "reserved_bytes"), _G),
        "limit_bytes": _S,
        **dict.fromkeys(("taken", "dropped", "dropped_bytes", "shelf_reads"), _C),
    },
    DiskTierStats: {
        **dict.fromkeys(("cache_dir", "block_size"), _M),
        **dict.fromkeys(
            ("hits", "hit_bytes", "misses", "queue_hits", "corrupt", "read_errors"), _C
        ),
    },
    InlineReadStats: dict.fromkeys(("reads", "slow_reads"), _C),
    DiskWriterStats: {
        **dict.fromkeys(("max_queue_bytes", "writers"), _M),  # each process's own, not divided
        **dict.fromkeys(("queued_blocks", "queued_bytes"), _G),
        "peak_queued_bytes": _P,
        **dict.fromkeys(
            (
                *("accepted", "duplicates", "dropped_queue_full", "dropped_queue_full_bytes"),
                *("written", "written_bytes", "already_cached", "dropped_no_space", "failed"),
                "abandoned",
            ),
            _C,
        ),
    },
    # the cache folder is one for every process: usage and capacity are each one's view of it
    PrunerStats: {
        **dict.fromkeys(
            (
                *("capacity_bytes", "used_bytes", "entries", "prune_start_bytes"),
                *("prune_goal_bytes", "last_scan_s", "disk_full"),
            ),
            _M,
        ),
        "reserved_bytes": _G,  # this process's writes in progress
        **dict.fromkeys(
            ("scans", "prune_runs", "pruned_entries", "pruned_bytes", "temporaries_removed"), _C
        ),
    },
    HintStats: {
        **dict.fromkeys(("streams", "ahead", "queued"), _G),
        **dict.fromkeys(("received", "invalid", "fetched", "used", "late", "wasted"), _C),
    },
    WholeFileStats: {
        "cache_dir": _M,
        "open_copies": _G,
        **dict.fromkeys(
            (
                *("served_bytes", "cached_opens", "shared_opens", "downloads"),
                *("downloaded_bytes", "failed_downloads", "fallbacks", "corrupt"),
                *("other_process_copies", "thread_writes", "preloaded_opens"),
            ),
            _C,
        ),
    },
    # each process has its own flow controller today: its limit, rate and breaker are the main's
    FlowStats: {
        "in_flight": _G,
        **dict.fromkeys(
            ("in_flight_limit", "in_flight_limit_max", "send_rate", "breaker", "breaker_open_s"),
            _M,
        ),
        **dict.fromkeys(
            (
                *("sent", "throttled", "timeouts", "limit_cuts", "rate_cuts", "queued_s"),
                *("breaker_opened", "fast_failures", "refusals_retried"),
            ),
            _C,
        ),
    },
}


#: what the main process sends a worker to have its figures written now
REFRESH_SIGNAL = signal.SIGUSR2
#: how long a report waits for the workers' fresh figures (a stuck worker's last ones then do)
REFRESH_WAIT_S = 0.5
_COUNTER = struct.Struct("<Q")


class StatsShare:
    """The stats files of one mount's processes, in its shared folder (which exists: the main
    process makes it before it forks).

    A file holds a process's snapshot and the number of the last refresh the main process had
    asked for when it was taken: a report asks the workers for fresh figures (`refreshed`), so
    what `blobmount stats` shows right after a read includes that read, whichever process
    served it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._unreadable: set[str] = set()  # files already logged as unreadable
        try:  # one counter the main process raises, read at each publish (pread/pwrite: the
            # descriptor is inherited, and a shared offset would be wrong)
            self._requests = os.open(folder / "stats-requests", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            log.warning("stats of the other processes cannot be refreshed: %s", exc)
            self._requests = -1

    def publish(self, snapshot: MountSnapshot) -> None:
        """Write `snapshot` as the file of process `snapshot.pid`, replacing its last one."""
        final = self.folder / f"{PREFIX}{snapshot.pid}{SUFFIX}"
        temporary = self.folder / f".{final.name}.tmp"  # not matched by the readers' glob
        answers = self._asked()  # read before the figures: they are at least that fresh
        data = {"answers": answers, "snapshot": snapshot.to_json()}
        temporary.write_text(json.dumps(data), encoding="utf-8")
        os.replace(temporary, final)

    def combined(self, own: MountSnapshot) -> MountSnapshot:
        """`own` (the main process's live snapshot) added to every other process's last one."""
        every: list[MountSnapshot] = []
        live: list[MountSnapshot] = []
        for pid, _, snapshot in self._published():
            if pid == own.pid:
                continue
            every.append(snapshot)
            if pid_alive(pid):
                live.append(snapshot)
        return _combine(own, every, live)

    def refreshed(self, own: MountSnapshot, wait_s: float = REFRESH_WAIT_S) -> MountSnapshot:
        """`combined`, once every live worker has written its figures anew (or `wait_s` has
        passed). Blocks the caller for about a millisecond: reports are rare."""
        asked = self._asked() + 1
        if self._requests >= 0:
            os.pwrite(self._requests, _COUNTER.pack(asked), 0)
        waiting = set()
        for pid, _, _ in self._published():
            if pid != own.pid and pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, REFRESH_SIGNAL)
                    waiting.add(pid)
        deadline = time.monotonic() + wait_s
        while waiting and time.monotonic() < deadline:
            time.sleep(0.001)
            fresh = {pid for pid, answers, _ in self._published() if answers >= asked}
            waiting -= fresh
            waiting = {pid for pid in waiting if pid_alive(pid)}
        return self.combined(own)

    def _asked(self) -> int:
        if self._requests < 0:
            return 0
        data = os.pread(self._requests, _COUNTER.size, 0)
        return int(_COUNTER.unpack(data)[0]) if len(data) == _COUNTER.size else 0

    def close(self) -> None:
        if self._requests >= 0:
            os.close(self._requests)
            self._requests = -1

    def _published(self) -> list[tuple[int, int, MountSnapshot]]:
        """(pid, refresh answered, snapshot) of every readable file."""
        found = []
        for path in sorted(self.folder.glob(f"{PREFIX}*{SUFFIX}")):
            number = path.name.removeprefix(PREFIX).removesuffix(SUFFIX)
            if not number.isdigit():
                continue
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                snapshot = MountSnapshot.from_json(data["snapshot"])
                found.append((int(number), int(data["answers"]), snapshot))
            except (OSError, ValueError, KeyError, TypeError, SnapshotFormatError) as exc:
                if path.name not in self._unreadable:
                    self._unreadable.add(path.name)
                    log.debug("ignoring the stats file %s: %s", path, exc)
        return found


async def publish_every(
    share: StatsShare,
    snapshot_fn: Callable[[], MountSnapshot],
    period_s: float = 1.0,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Publish this process's snapshot every `period_s`, and at once when the main process asks
    (REFRESH_SIGNAL), until cancelled, and once more then (its last counts would otherwise be
    lost). Started with `nursery.start`: the signal is handled once it returns. A file that
    cannot be written (/dev/shm full, the folder gone at unmount) is logged, not raised: the
    stats are not worth a worker."""
    failed = False
    with trio.open_signal_receiver(REFRESH_SIGNAL) as asked:
        task_status.started()
        try:
            while True:
                try:
                    share.publish(snapshot_fn())
                except OSError as exc:
                    if not failed:
                        log.warning("cannot publish this process's stats: %s", exc)
                    failed = True
                with trio.move_on_after(period_s):
                    await asked.__anext__()
        finally:
            try:
                share.publish(snapshot_fn())
            except Exception as exc:  # on the way out: never hide why the task ends
                log.debug("cannot publish this process's last stats: %s", exc)


# -- the sums ----------------------------------------------------------------------------------


_D = TypeVar("_D", bound="DataclassInstance")


def _combine(own: _D, every: Sequence[_D], live: Sequence[_D]) -> _D:
    """`own` with each figure added up with those of `every` other process (`live`: those still
    running), field by field as `FIELDS` says."""
    kinds = FIELDS.get(type(own), {})
    values: dict[str, Any] = {}
    for field in dataclasses.fields(own):
        name = field.name
        mine = getattr(own, name)
        if mine is None:  # a section that is off here
            values[name] = None
        elif dataclasses.is_dataclass(mine):
            values[name] = _combine(mine, _present(every, name), _present(live, name))
        else:
            kind = kinds.get(name, Kind.MAIN)
            if kind is Kind.COUNTER:
                values[name] = _sum(mine, [getattr(other, name) for other in every])
            elif kind in (Kind.GAUGE, Kind.SHARE):
                values[name] = _sum(mine, [getattr(other, name) for other in live])
            elif kind is Kind.PEAK:
                values[name] = max([mine, *(getattr(other, name) for other in every)])
            elif kind is Kind.EACH:
                values[name] = sum((getattr(other, name) for other in live), mine)
            else:
                values[name] = mine
    return dataclasses.replace(own, **values)


def _present(snapshots: Sequence[object], name: str) -> list[Any]:
    return [value for s in snapshots if (value := getattr(s, name)) is not None]


def _sum(mine: Any, others: list[Any]) -> Any:
    """A number plus numbers, or a dict of counts plus dicts of counts, key by key."""
    if isinstance(mine, dict):
        total = dict(mine)
        for other in others:
            for key, count in other.items():
                total[key] = total.get(key, 0) + count
        return total
    return sum(others, mine)
