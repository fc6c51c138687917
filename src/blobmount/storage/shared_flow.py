"""The account's circuit breaker and Retry-After pause, shared by the processes of one mount.

Each process of a multi-process mount has its own flow controller (storage/flow.py), and its
in-flight limit and send rate learn from its own requests' answers, as separate connections
would. Two things are the account's, not a connection's, and must be one for the mount:

- **the breaker.** Apart, each process would need its own few seconds of nothing but failures
  before it failed reads at once, each would send its own probe every interval (N probes where
  one client sends one), and `blobmount stats`, served by the main process, would report the
  main process's breaker while another process failed reads at once. Here any process's run of
  failures opens the one breaker, every process then fails new requests at once, one probe at a
  time goes out for the whole mount, and its answer closes the breaker for all.
- **the Retry-After pause.** Storage asks the account's client to wait; without sharing, each
  process would send one more request to learn it.

The state lives in a small file of the mount's shared folder, mapped by every process (made by
the main process before it forks). Every change holds a POSIX record lock on it and bumps a
generation number; a reader compares the generation (one word, read without the lock) with the
one it last saw and reads the record again, under the lock, only when it changed. So the check
every request makes is a word compare, and no process ever acts on a half-written record.

Times in the file are `time.monotonic()` seconds, one clock for every process of the machine
(the controllers' trio clocks each have their own offset). A probe's owner is recorded by pid:
a probe whose process died is no longer waited for.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from blobmount.runstate import pid_alive
from blobmount.shared_file import create_mapped
from blobmount.storage.breaker import (
    MIN_FAILURES,
    OPEN_AFTER_S,
    PROBE_INTERVAL_S,
    Admission,
    BreakerState,
    FailureRun,
    log_closed,
)

FILE_NAME = "flow"
#: a probe claimed this long ago is no longer waited for, whatever its process: a request's
#: longest life (a read timeout) is far shorter
PROBE_STALE_S = 300.0

#: generation, state, opened at, next probe at, probe's pid, probe claimed at, paused until
_RECORD = struct.Struct("<Qqddqdd")
_GENERATION = struct.Struct("<Q")
_LENGTH = 4096
_STATES = list(BreakerState)


@dataclass(frozen=True, slots=True)
class FlowRecord:
    """The shared state; times are `time.monotonic()` seconds."""

    state: BreakerState = BreakerState.CLOSED
    opened_at: float = math.inf
    next_probe_at: float = math.inf
    probe_pid: int = 0  # 0: no probe out
    probe_at: float = -math.inf
    paused_until: float = -math.inf


class SharedFlow:
    """The record every process of a mount maps (see the module docstring). Create it in the
    main process before forking; each process makes its `SharedBreaker` from it. Used from one
    thread per process (the controllers' trio thread)."""

    def __init__(self, fd: int, mm: mmap.mmap, clock: Callable[[], float]) -> None:
        self._fd = fd
        self._mm = mm
        self.clock = clock
        self._generation = -1
        self._record = FlowRecord()

    @classmethod
    def create(
        cls, folder: Path, name: str = FILE_NAME, clock: Callable[[], float] = time.monotonic
    ) -> SharedFlow:
        """A new record (breaker closed, no pause) in file `name` of `folder`, which must not
        exist yet."""
        fd, mm = create_mapped(folder / name, _LENGTH)
        shared = cls(fd, mm, clock)
        with shared.changing() as change:
            change.record = FlowRecord()
        return shared

    def close(self) -> None:
        if self._fd < 0:
            return
        self._mm.close()
        os.close(self._fd)
        self._fd = -1

    def read(self) -> FlowRecord:
        """The record as last written: read under the lock only when it changed."""
        (generation,) = _GENERATION.unpack_from(self._mm, 0)
        if generation != self._generation:
            with self._locked():
                self._load()
        return self._record

    @contextmanager
    def changing(self) -> Iterator[_Change]:
        """Under the lock, with the record read afresh: set `change.record` to write it."""
        with self._locked():
            self._load()
            change = _Change(self._record)
            yield change
            if change.record is not self._record:
                self._store(change.record)

    def pause_for(self, seconds: float) -> None:
        """Storage asked for a pause of `seconds` (Retry-After): no process sends before it ends."""
        until = self.clock() + seconds
        if until <= self.read().paused_until:
            return
        with self.changing() as change:
            if until > change.record.paused_until:
                change.record = replace(change.record, paused_until=until)

    def pause_remaining(self) -> float:
        return max(0.0, self.read().paused_until - self.clock())

    # -- the file ---------------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.lockf(self._fd, fcntl.LOCK_EX, _LENGTH, 0)
        try:
            yield
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, _LENGTH, 0)

    def _load(self) -> None:
        generation, state, opened_at, next_probe_at, pid, probe_at, paused = _RECORD.unpack_from(
            self._mm, 0
        )
        self._generation = generation
        self._record = FlowRecord(_STATES[state], opened_at, next_probe_at, pid, probe_at, paused)

    def _store(self, record: FlowRecord) -> None:
        generation = self._generation + 1
        _RECORD.pack_into(
            self._mm,
            0,
            generation,
            _STATES.index(record.state),
            record.opened_at,
            record.next_probe_at,
            record.probe_pid,
            record.probe_at,
            record.paused_until,
        )
        self._generation, self._record = generation, record


@dataclass(slots=True)
class _Change:
    record: FlowRecord


class SharedBreaker:
    """One process's view of the mount's breaker: the `Breaker` the flow controller drives.
    This process's failures are counted here, as `CircuitBreaker` counts them; when they say
    storage is down the shared breaker opens, and from then on the shared record decides. The
    times the controller passes (its trio clock) time the failure run only; the shared times
    are the record's clock."""

    def __init__(
        self,
        shared: SharedFlow,
        *,
        open_after_s: float = OPEN_AFTER_S,
        min_failures: int = MIN_FAILURES,
        probe_interval_s: float = PROBE_INTERVAL_S,
    ) -> None:
        self._shared = shared
        self._run = FailureRun(open_after_s, min_failures)
        self._probe_interval_s = probe_interval_s
        #: times this process opened the mount's breaker (summed over the processes in stats)
        self.opened = 0
        self._probing = False  # the probe out is this process's

    @property
    def state(self) -> BreakerState:
        return self._shared.read().state

    def open_s(self, now: float) -> float:
        record = self._shared.read()
        if record.state is BreakerState.CLOSED:
            return 0.0
        return max(0.0, self._shared.clock() - record.opened_at)

    def rejects(self, now: float) -> bool:
        record = self._shared.read()
        return record.state is not BreakerState.CLOSED and self._waits(record)

    def admit(self, now: float) -> Admission:
        if self._shared.read().state is BreakerState.CLOSED:
            return Admission.PASS
        with self._shared.changing() as change:
            record = change.record
            if record.state is BreakerState.CLOSED:
                return Admission.PASS
            if self._waits(record):
                return Admission.REJECT
            change.record = replace(
                record,
                state=BreakerState.HALF_OPEN,
                probe_pid=os.getpid(),
                probe_at=self._shared.clock(),
            )
        self._probing = True
        return Admission.PROBE

    def on_answer(self, now: float, *, probe: bool = False) -> None:
        self._run.reset()
        state = self._shared.read().state
        if state is BreakerState.CLOSED or not (probe or state is BreakerState.HALF_OPEN):
            return
        self._probing = False
        with self._shared.changing() as change:
            record = change.record
            if record.state is not BreakerState.CLOSED:
                log_closed(self._shared.clock() - record.opened_at)
                change.record = replace(record, state=BreakerState.CLOSED, probe_pid=0)

    def probe_abandoned(self) -> None:
        if not self._probing:
            return
        self._probing = False
        with self._shared.changing() as change:
            if change.record.probe_pid == os.getpid():
                change.record = replace(
                    change.record, state=BreakerState.OPEN, probe_pid=0, next_probe_at=-math.inf
                )

    def on_failure(self, now: float, key: str, *, probe: bool = False) -> None:
        state = self._shared.read().state
        if probe or state is BreakerState.HALF_OPEN:
            self._probing = False
            with self._shared.changing() as change:
                if change.record.state is not BreakerState.CLOSED:
                    change.record = self._reopened(change.record)
            return
        if state is BreakerState.OPEN:
            return  # a request sent before it opened
        if not self._run.add(now, key):
            return
        with self._shared.changing() as change:
            if change.record.state is BreakerState.CLOSED:
                opened_at = self._shared.clock()
                change.record = replace(self._reopened(change.record), opened_at=opened_at)
                self.opened += 1
                self._run.log_opened(now)
        self._run.reset()

    def _reopened(self, record: FlowRecord) -> FlowRecord:
        """`record` open, no probe out, the next one an interval from now."""
        return replace(
            record,
            state=BreakerState.OPEN,
            probe_pid=0,
            next_probe_at=self._shared.clock() + self._probe_interval_s,
        )

    def _waits(self, record: FlowRecord) -> bool:
        """Whether a request must wait while the breaker is as `record` says: before the next
        probe's time, or while a probe is out (unless its process is gone or it is stale)."""
        now = self._shared.clock()
        if now < record.next_probe_at:
            return True
        if record.probe_pid == 0 or now - record.probe_at > PROBE_STALE_S:
            return False
        return record.probe_pid == os.getpid() or pid_alive(record.probe_pid)
