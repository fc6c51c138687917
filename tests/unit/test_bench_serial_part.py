"""The serial part of a run (benchmarks/scenarios/serial_part.py), from the per-process figures
of two `blobmount stats --json` snapshots, and the bound a 1-process run's busy cores put on
more processes on the same machine (synthetic_report.machine_bound_lines)."""

from __future__ import annotations

from typing import Any

import pytest
from scenarios.process_tree import TreeUsage
from scenarios.serial_part import ProcessDelta, process_deltas, serial_part
from scenarios.synthetic_group import SCENARIOS
from scenarios.synthetic_mount import MountRun
from scenarios.synthetic_report import Row, machine_bound_lines


def figures(pid: int, main: bool, **values: float) -> dict[str, Any]:
    base = dict.fromkeys(
        ("requests", "passed_on", "answered_for_others", "bytes_served", "cpu_s"), 0
    )
    return {"pid": pid, "main": main, **base, "shared_lock_s": 0.0, **values}


def test_deltas_count_the_work_each_process_did_and_a_new_process_from_zero() -> None:
    before = {"processes": [figures(1, True, requests=10, cpu_s=1.0), figures(2, False)]}
    after = {
        "processes": [
            # 100 taken from the kernel, 30 of them passed to the opener, 5 done for another
            figures(1, True, requests=110, passed_on=30, answered_for_others=5, cpu_s=3.0),
            figures(3, False, requests=40, bytes_served=4096, cpu_s=0.5, shared_lock_s=0.25),
        ]
    }
    assert process_deltas(before, after) == [
        ProcessDelta(1, True, 75, 0, 2.0, 0.0),
        ProcessDelta(3, False, 40, 4096, 0.5, 0.25),  # replaced worker 3: all of it is new
    ]
    assert process_deltas(before, {"processes": []}) == []
    assert process_deltas({"storage": {}}, after) == []  # a daemon that lists no processes


def test_the_main_process_beyond_its_share_plus_the_locks_is_serial() -> None:
    # the worker spends 1 ms per request; the main process did 300 requests in 0.5 s, 0.2 s
    # more than they cost the worker; 0.03 s under the shared locks in all
    deltas = [
        ProcessDelta(1, True, 300, 0, 0.5, 0.01),
        ProcessDelta(2, False, 700, 0, 0.7, 0.02),
    ]
    part = serial_part(deltas, "requests")
    assert part is not None
    assert part.processes == 2
    assert part.main_share == pytest.approx(0.3)
    assert part.main_extra_s == pytest.approx(0.2)
    assert part.locks_s == pytest.approx(0.03)
    assert part.total_s == pytest.approx(0.23)
    # counted in bytes instead: the worker's 1 MB cost 0.7 s, the main's 3 MB 2.1 s: below 0
    deltas = [
        ProcessDelta(1, True, 0, 3_000_000, 0.5, 0.0),
        ProcessDelta(2, False, 0, 10**6, 0.7, 0),
    ]
    part = serial_part(deltas, "bytes")
    assert part is not None
    assert part.main_extra_s == pytest.approx(0.5 - 2.1)
    assert part.total_s == 0.0  # noise below zero counts as none


def test_one_process_or_one_stream_is_all_serial_and_no_work_is_no_figure() -> None:
    one = serial_part([ProcessDelta(1, True, 500, 0, 0.4, 0.0)], "requests")
    assert one is not None
    assert (one.main_share, one.total_s) == (1.0, 0.4)
    # one reader's large file, opened in the worker: it served every byte
    stream = serial_part(
        [ProcessDelta(1, True, 0, 0, 0.1, 0.0), ProcessDelta(2, False, 0, 8 << 20, 0.9, 0.0)],
        "bytes",
    )
    assert stream is not None
    assert (stream.main_share, stream.total_s) == (1.0, 0.9)
    assert serial_part([ProcessDelta(1, True, 0, 0, 0.1, 0.0)], "requests") is None
    assert serial_part([ProcessDelta(2, False, 5, 0, 0.1, 0.0)], "requests") is None


def run(wall_s: float, tree_s: float, harness_s: float) -> MountRun:
    usage = TreeUsage(wall_s, tree_s, tree_s, harness_s, 0.0, 1, 0, 0)
    return MountRun(seconds=wall_s, usage=usage, verified=True, mismatch_at=None)


def test_the_one_process_runs_busy_cores_bound_more_processes_on_this_machine() -> None:
    scenario = next(s for s in SCENARIOS if s.name == "synthetic-small-16")
    one = Row(scenario, "blobmount-p1", 1, 1000, 25_000_000, mount_runs=[run(1.0, 0.9, 0.35)])
    two = Row(scenario, "blobmount-p2", 2, 1000, 25_000_000, mount_runs=[run(0.8, 1.5, 0.4)])
    text = "\n".join(machine_bound_lines([one, two], cores=2))
    # 1.25 cores busy of 2: at most 1.6x with 2 processes; measured 1 / 0.8 = 1.25x
    assert "| synthetic-small-16 | 2 | 1.25 of 2 | 1.60x | 1.25x |" in text
    # on a machine with cores to spare, N processes are the bound
    assert "| 2.00x |" in "\n".join(machine_bound_lines([one, two], cores=16))
    assert machine_bound_lines([one], cores=2) == []
