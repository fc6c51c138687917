"""The breaker and Retry-After pause the processes of a mount share (storage/shared_flow.py):
real processes (the test forks, as the mount does, after the record is created), a clock in
shared memory that the test moves by hand."""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from blobmount.storage.breaker import Admission, BreakerState
from blobmount.storage.flow import FlowConfig, FlowController
from blobmount.storage.overload import Throttled
from blobmount.storage.shared_flow import SharedBreaker, SharedFlow


class Clock:
    """Seconds that every forked process reads and the test sets."""

    def __init__(self) -> None:
        self._value = multiprocessing.get_context("fork").Value("d", 100.0, lock=False)

    def __call__(self) -> float:
        return float(self._value.value)

    def set(self, seconds: float) -> None:
        self._value.value = seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def shared(tmp_path: Path, clock: Clock) -> Iterator[SharedFlow]:
    flow = SharedFlow.create(tmp_path, clock=clock)
    yield flow
    flow.close()


def in_child(fn: Callable[[], Any]) -> Any:
    """`fn()` run in a forked process (which then exits); its result, or its exception raised."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            outcome: tuple[bool, Any] = (True, fn())
        except BaseException as exc:
            outcome = (False, exc)
        os.write(write_end, pickle.dumps(outcome))
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        data = answer.read()
    os.waitpid(pid, 0)
    ok, value = pickle.loads(data)
    if not ok:
        raise value
    return value


def breaker(shared: SharedFlow) -> SharedBreaker:
    return SharedBreaker(shared, open_after_s=5.0, probe_interval_s=2.0)


def fail_for(b: SharedBreaker, start: float, end: float) -> None:
    """Failures of two blobs every half second (the run's clock is the caller's)."""
    t, i = start, 0
    while t <= end:
        b.on_failure(t, "ab"[i % 2])
        t += 0.5
        i += 1


def test_one_process_opens_the_breaker_for_all_and_one_probe_closes_it(
    shared: SharedFlow, clock: Clock
) -> None:
    mine = breaker(shared)
    clock.set(105.0)

    def other_opens() -> tuple[str, int]:
        b = breaker(shared)
        fail_for(b, 0.0, 5.0)
        return b.state.value, b.opened

    # another process's failures open the breaker; this one counts no opening of its own
    assert in_child(other_opens) == ("open", 1)
    assert mine.state is BreakerState.OPEN
    assert mine.opened == 0
    assert mine.rejects(0.0)
    assert mine.admit(0.0) is Admission.REJECT
    clock.set(106.5)
    assert mine.open_s(0.0) == pytest.approx(1.5)
    # failures here while it is open (requests sent before) open nothing again
    fail_for(mine, 0.0, 10.0)
    assert mine.opened == 0

    # after the interval one process takes the probe; the others are refused while it is out
    clock.set(107.0)
    assert mine.admit(0.0) is Admission.PROBE
    assert shared.read().state is BreakerState.HALF_OPEN

    def other_admits() -> tuple[str, bool]:
        b = breaker(shared)
        return b.admit(0.0).value, b.rejects(0.0)

    assert in_child(other_admits) == ("reject", True)
    # the probe failed: open again, the next probe an interval later, in any process
    mine.on_failure(0.0, "a", probe=True)
    assert mine.state is BreakerState.OPEN
    clock.set(108.0)
    assert in_child(other_admits) == ("reject", True)
    clock.set(109.0)

    def other_probes_and_gets_an_answer() -> str:
        b = breaker(shared)
        assert b.admit(0.0) is Admission.PROBE
        b.on_answer(0.0, probe=True)
        return b.state.value

    assert in_child(other_probes_and_gets_an_answer) == "closed"
    assert shared.read().state is BreakerState.CLOSED
    assert mine.admit(0.0) is Admission.PASS
    assert mine.open_s(0.0) == 0.0


def test_a_probe_whose_process_died_is_not_waited_for(shared: SharedFlow, clock: Clock) -> None:
    mine = breaker(shared)
    fail_for(mine, 0.0, 5.0)
    assert mine.opened == 1
    clock.set(102.0)

    def probe_and_die() -> str:
        return breaker(shared).admit(0.0).value

    assert in_child(probe_and_die) == "probe"
    # the prober is gone (reaped): its probe will never be answered, so this one probes
    assert shared.read().probe_pid != 0
    assert mine.admit(0.0) is Admission.PROBE
    assert shared.read().probe_pid == os.getpid()


def test_an_abandoned_probe_lets_any_process_probe_at_once(
    shared: SharedFlow, clock: Clock
) -> None:
    mine = breaker(shared)
    fail_for(mine, 0.0, 5.0)
    clock.set(102.0)
    assert mine.admit(0.0) is Admission.PROBE
    mine.probe_abandoned()
    assert shared.read().next_probe_at == -math.inf
    assert in_child(lambda: breaker(shared).admit(0.0).value) == "probe"


def test_failures_apart_do_not_add_up_across_processes(shared: SharedFlow) -> None:
    # each process needs its own run of failures: a few failures here and there are not an
    # outage, and a run is broken by any answer in the process that sees it
    mine = breaker(shared)
    fail_for(mine, 0.0, 4.0)

    def other_fails_briefly() -> str:
        b = breaker(shared)
        fail_for(b, 0.0, 4.0)
        return b.state.value

    assert in_child(other_fails_briefly) == "closed"
    assert mine.state is BreakerState.CLOSED
    fail_for(mine, 4.5, 5.0)
    assert shared.read().state is BreakerState.OPEN


def test_a_retry_after_pauses_every_process(shared: SharedFlow, clock: Clock) -> None:
    assert shared.pause_remaining() == 0.0
    in_child(lambda: shared.pause_for(3.0))
    assert shared.pause_remaining() == pytest.approx(3.0)
    # a shorter pause does not cut a longer one short
    in_child(lambda: shared.pause_for(1.0))
    assert shared.pause_remaining() == pytest.approx(3.0)
    clock.set(102.0)
    assert shared.pause_remaining() == pytest.approx(1.0)
    clock.set(104.0)
    assert shared.pause_remaining() == 0.0


async def test_a_retry_after_one_controller_gets_pauses_the_others(
    shared: SharedFlow, clock: Clock
) -> None:
    controller = FlowController("acct", FlowConfig(), shared)
    assert controller.pause_remaining() == 0.0
    in_child(lambda: shared.pause_for(30.0))
    assert controller.pause_remaining() == pytest.approx(30.0)
    clock.set(130.0)
    # and the other way: the answer this controller gets pauses another process's
    sent = await controller.acquire(lambda: "GET f")
    sent.failed(Throttled("503", status=503, retry_after_s=10.0), "f")

    def other_waits() -> float:
        return FlowController("acct", FlowConfig(), shared).pause_remaining()

    assert in_child(other_waits) == pytest.approx(10.0)
