"""Background LRU pruning of a cache directory, and the one account of its space in a process.

A `Pruner` owns the `CacheBudget` of one cache directory. Its task scans the directory once at
start (taking the usage and the LRU order from the files themselves, removing temporaries left by
dead processes), then runs a *pass* whenever woken (usage reached the prune threshold, or a writer
found no room) and every `rescan_interval_s` (to learn what other processes sharing the directory
wrote). A pass rescans, and if usage is at or above ``threshold * capacity`` removes the least
recently used entries (oldest mtime first, across every kind and location) until usage is at most
``target * capacity``. Scans and removals run in a worker thread: readers never wait for them.

Writers call `make_room` before they write: it reserves the bytes if they fit, else wakes the
pruner, waits for its pass and tries again (other writers may have taken the room a pass made).
When a pass that tried to prune finds nothing it may remove and the bytes still do not fit (the
disk is full because something else filled it) the write is skipped; the cache logs that once and
backs off for a few seconds, so a full disk costs a counter increment per block, not a pass per
block.

Several processes may share a directory: one pass at a time prunes (an flock), and the free
space read after each write tells a process at once when something else takes space. Separate
mounts each have their own budget, and each scan corrects a mount's view of what the others
wrote. The processes of one mount share their budget's figures (`shared_budget`, see
`cachedir.shared_budget`): a reservation in any of them sees every one's writes at once, and a
pass counts the others' writes in progress as room it must make.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from blobmount.cachedir.layout import CacheEntry, CacheLayout, DirLock, free_bytes
from blobmount.cachedir.shared_budget import SharedBudgetCounters
from blobmount.cachedir.space import (
    AgeHistogram,
    CacheBudget,
    SpaceConfig,
    capacity_bytes,
    needs_pruning,
    prune_goal_bytes,
    prune_start_bytes,
)
from blobmount.units import format_size

log = logging.getLogger(__name__)

#: a writer waits for at most this many passes before it skips its block
MAX_PASSES_PER_WRITE = 8


@dataclass(frozen=True, slots=True)
class PrunerConfig:
    space: SpaceConfig
    rescan_interval_s: float = 300.0
    #: after failing to make room, skip writes without trying again for this long
    full_backoff_s: float = 5.0


@dataclass(frozen=True, slots=True)
class PrunerStats:
    capacity_bytes: int
    used_bytes: int
    reserved_bytes: int
    entries: int
    prune_start_bytes: int
    prune_goal_bytes: int
    scans: int
    prune_runs: int
    pruned_entries: int
    pruned_bytes: int
    temporaries_removed: int
    last_scan_s: float
    disk_full: bool


class _Enough(Exception):
    """Stops the pruning walk once enough is freed."""


@dataclass(frozen=True, slots=True)
class _PassOutcome:
    used_bytes: int
    entries: int
    free_bytes: int
    pruned_entries: int
    pruned_bytes: int
    temporaries_removed: int
    pruned: bool
    scan_s: float
    #: entries the scan saw written or touched shortly before it started, or since
    recent: frozenset[str]
    #: another process held the prune lock, so this pass could not prune
    contended: bool
    #: bytes of entries last used before the pass started (what it could have removed)
    removable_bytes: int


class Pruner:
    """Space accounting and LRU pruning for one cache directory (see the module docstring).

    `keep(path)`, if given, is called from a worker thread for each entry about to be removed;
    True spares it (whole-file mode keeps files that are open).
    """

    def __init__(
        self,
        layout: CacheLayout,
        config: PrunerConfig,
        *,
        keep: Callable[[Path], bool] | None = None,
        shared_budget: SharedBudgetCounters | None = None,
    ) -> None:
        self.layout = layout
        self.config = config
        self.budget = CacheBudget(config.space, shared_budget)
        self.ready = trio.Event()  # set after the first scan
        self._keep = keep
        self._wake = trio.Event()
        self._pass_finished = trio.Event()
        self._room_wanted = 0
        # A scan may or may not see a write that ends around it; these make sure each write is
        # counted once: writes in progress, writes that ended while a pass scanned, and writes
        # still in progress whose finished file a pass has already counted.
        # keyed by the path as a string: writers on the hot path build plain strings
        self._in_flight: dict[str, int] = {}
        self._written_during_pass: list[tuple[str, int]] | None = None
        self._counted_by_scan: set[str] = set()
        self._full_until = -math.inf
        self._last_pass_removable = False
        self._last_pass_pruned = False
        self._last_pass_contended = False
        self._full = False
        self._full_logged = False
        self._limiter = trio.CapacityLimiter(1)
        self._scans = 0
        self._prune_runs = 0
        self._pruned_entries = 0
        self._pruned_bytes = 0
        self._temporaries_removed = 0
        self._last_scan_s = 0.0

    # -- called by writers (trio thread) -----------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    async def make_room(self, nbytes: int) -> bool:
        """Reserve `nbytes` for a write, pruning first if needed. False if there is no room;
        then the caller must not write. A successful reservation must be ended with
        `end_write`."""
        await self.ready.wait()
        for _ in range(MAX_PASSES_PER_WRITE):
            if self.budget.try_reserve(nbytes):
                self._full = False
                if self.budget.should_prune():
                    self.wake()
                return True
            if trio.current_time() < self._full_until:
                return False
            self._room_wanted = max(self._room_wanted, nbytes)
            finished = self._pass_finished
            self.wake()
            await finished.wait()
            if self._last_pass_contended:
                # another process is pruning this directory; its pass frees room for us too
                await trio.sleep(0.1)
            elif self._last_pass_pruned and not self._last_pass_removable:
                # it had nothing it could remove: the disk is full of other things
                self.report_full(f"no room for {format_size(nbytes)}")
                return False
            # else: other writers took the room this pass made, or wrote while it scanned;
            # go round again
        return False

    def report_full(self, why: str, *, disk_says_so: bool = False) -> None:
        """The cache cannot take more data (no room, or the disk said ENOSPC). Logged once."""
        if disk_says_so:
            # trust the disk over the last reading until the next pass measures it again
            self.budget.observe_free(0)
        self._full = True
        self._full_until = trio.current_time() + self.config.full_backoff_s
        if not self._full_logged:
            self._full_logged = True
            log.warning(
                "disk cache %s is full (%s; cache uses %s, may use %s): reads are served from "
                "storage and new data is not cached until space is freed",
                self.layout.root,
                why,
                format_size(self.budget.used_bytes),
                format_size(self.budget.capacity()),
            )
        self.wake()

    def begin_write(self, path: str | Path, reserved: int) -> None:
        """A write to `path`, of `reserved` bytes reserved with `make_room`, starts."""
        self._in_flight[os.fspath(path)] = reserved

    def end_write(
        self, path: str | Path, reserved: int, written: int, free_after: int | None
    ) -> None:
        """A write ended: `written` bytes now occupy `path` (0: nothing was written), and
        `free_after` is the disk's free space after it (None if unknown)."""
        path = os.fspath(path)
        self._in_flight.pop(path, None)
        if path in self._counted_by_scan:
            # a pass already saw the finished file and counted it
            self._counted_by_scan.discard(path)
            written = 0
        self.budget.settle(reserved, written)
        if written and self._written_during_pass is not None:
            self._written_during_pass.append((path, written))
        if free_after is not None:
            # keeps room current between scans
            self.budget.observe_free(free_after)
        if self.budget.should_prune():
            self.wake()

    # -- the task ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Scan, then prune when woken or every rescan interval. Runs until cancelled."""
        try:
            await self._pass()
        finally:
            self.ready.set()
        while True:
            with trio.move_on_after(self.config.rescan_interval_s):
                await self._wake.wait()
            await self._pass()

    async def _pass(self) -> None:
        self._wake = trio.Event()
        budget = self.budget
        # Room asked for by a waiting writer, and (shared budget) what other processes' writes
        # in progress hold; the thread adds what this process's writes in progress hold. The
        # scan also counts the others' temporaries, which is counting them twice until the next
        # scan after they land. That errs on the safe side, and it matches what the budget will
        # count after the rebase: a pass that made room by its own count and left the budget
        # still full would wake the next pass at once.
        want = self._room_wanted + budget.others_reserved_bytes
        self._room_wanted = 0
        mark = budget.settled_mark()
        in_flight = dict(self._in_flight)
        during: list[tuple[str, int]] = []
        self._written_during_pass = during
        try:
            outcome = await trio.to_thread.run_sync(
                self._scan_and_prune, want, in_flight, limiter=self._limiter
            )
        except OSError as exc:
            log.warning("cannot scan disk cache %s: %s", self.layout.root, exc)
        else:
            missed = [size for path, size in during if path not in outcome.recent]
            self._counted_by_scan |= self._in_flight.keys() & outcome.recent
            # Room from the thread's own numbers alone: usage seen by the scan (after pruning)
            # plus free space read after it. A write that lands between the two is in neither
            # or only out of free, so this never overstates room. Usage also counts the writes
            # the scan missed, since they are on disk.
            budget.rebase(
                outcome.used_bytes + sum(missed),
                outcome.entries + len(missed),
                outcome.used_bytes + outcome.free_bytes,
                since=mark,
            )
            self._last_pass_removable = outcome.removable_bytes > 0
            self._last_pass_pruned = outcome.pruned
            self._last_pass_contended = outcome.contended
            self._scans += 1
            self._prune_runs += outcome.pruned
            self._pruned_entries += outcome.pruned_entries
            self._pruned_bytes += outcome.pruned_bytes
            self._temporaries_removed += outcome.temporaries_removed
            self._last_scan_s = outcome.scan_s
            if outcome.pruned_entries:
                log.info(
                    "pruned %d cache entries (%s) from %s; %s in use of %s",
                    outcome.pruned_entries,
                    format_size(outcome.pruned_bytes),
                    self.layout.root,
                    format_size(budget.used_bytes),
                    format_size(budget.capacity()),
                )
        finally:
            self._written_during_pass = None
            finished, self._pass_finished = self._pass_finished, trio.Event()
            finished.set()

    def _scan_and_prune(self, want: int, in_flight: dict[str, int]) -> _PassOutcome:
        """(worker thread) Scan; prune to the goal if at or above the threshold, counting
        `want` more bytes and the writes in progress (`in_flight`: path -> reserved bytes)
        whose finished files the scan did not see.

        The first walk totals usage and builds an age histogram; pruning walks again and
        removes what the histogram says is oldest, so memory does not grow with the cache.
        """
        space = self.config.space
        started = time.time()
        t0 = time.monotonic()
        lock = DirLock(self.layout.prune_lock_path)
        # another process pruning right now frees the space for us too
        have_lock = lock.acquire(shared=False)
        try:
            ages = AgeHistogram()
            recent: set[str] = set()
            removable = 0  # bytes last used before this pass: the most it may free

            def survey(entry: CacheEntry) -> None:
                nonlocal removable
                ages.add(entry.last_used_s, entry.size_bytes)
                if entry.last_used_s <= started:
                    removable += entry.size_bytes
                # mtime comes from the same clock; the margin covers coarse timestamps
                if entry.last_used_s >= started - 2.0:
                    recent.add(entry.path)

            scan = self.layout.scan(survey, remove_stale_temporaries=True, now=started)
            extra = want + sum(size for path, size in in_flight.items() if path not in recent)
            free, _ = free_bytes(self.layout.root)
            used = scan.used_bytes
            capacity = capacity_bytes(space, used, free)
            pruned_entries = pruned_bytes = 0
            pruning = have_lock and (
                needs_pruning(space, used + extra, capacity) or used + extra > capacity
            )
            if pruning:
                need = used + extra - prune_goal_bytes(space, capacity)
                cut = ages.cut(need)

                def prune(entry: CacheEntry) -> None:
                    nonlocal pruned_entries, pruned_bytes
                    if pruned_bytes >= need:
                        raise _Enough
                    if not cut.take(entry.last_used_s, entry.size_bytes):
                        return
                    freed = self.layout.remove_entry(
                        entry.path, unless_used_after=started, keep=self._keep
                    )
                    if freed is not None:
                        pruned_entries += 1
                        pruned_bytes += entry.size_bytes

                try:
                    self.layout.scan(prune, remove_stale_temporaries=False, now=started)
                except _Enough:
                    pass
                if pruned_entries:
                    free, _ = free_bytes(self.layout.root)
        finally:
            lock.release()
        return _PassOutcome(
            recent=frozenset(recent),
            removable_bytes=removable,
            contended=not have_lock,
            used_bytes=max(0, used - pruned_bytes),
            entries=max(0, scan.entries - pruned_entries),
            free_bytes=free,
            pruned_entries=pruned_entries,
            pruned_bytes=pruned_bytes,
            temporaries_removed=scan.temporaries_removed,
            pruned=pruning,
            scan_s=time.monotonic() - t0,
        )

    def statistics(self) -> PrunerStats:
        capacity = self.budget.capacity()
        figures = self.budget.figures()  # one read of a shared record, not three
        space = self.config.space
        return PrunerStats(
            capacity_bytes=capacity,
            used_bytes=figures.used_bytes,
            # this process's own, also with a shared budget: the stats of a multi-process
            # mount sum it over the processes
            reserved_bytes=figures.own_reserved_bytes,
            entries=figures.entries,
            prune_start_bytes=prune_start_bytes(space, capacity),
            prune_goal_bytes=prune_goal_bytes(space, capacity),
            scans=self._scans,
            prune_runs=self._prune_runs,
            pruned_entries=self._pruned_entries,
            pruned_bytes=self._pruned_bytes,
            temporaries_removed=self._temporaries_removed,
            last_scan_s=self._last_scan_s,
            disk_full=self._full,
        )
