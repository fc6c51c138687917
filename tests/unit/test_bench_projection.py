"""The report's projected per-mount ceiling (benchmarks/scenarios/projection.py): Amdahl's
bound from the run's 2-process CPU per file and per GiB, with its assumptions."""

from __future__ import annotations

from scenarios.plans import GiB
from scenarios.projection import NODE_CORES, projection_lines
from scenarios.results import RunMetrics, SystemResult
from scenarios.serial_part import SerialPart


def result(
    scenario: str, system: str, cpu_s: float, files: int, size: int, serial_s: float | None = None
) -> SystemResult:
    serial = None if serial_s is None else SerialPart(2, 0.5, serial_s, 0.0)
    runs = [
        RunMetrics(seconds=s, verified=True, client_cpu_s=cpu_s + s, serial=serial)
        for s in (1.0, 2.0, 3.0)
    ]
    return SystemResult(scenario, system, "mount", "", size, files, runs=runs)


def test_the_bound_is_the_cores_over_the_two_process_cpu_per_item() -> None:
    # median runs: 2 s, so CPU 10 + 2 = 12 s and 20 + 2 = 22 s for 10,000 files / 2 GiB
    results = [
        result("small-files", "blobmount", 10.0, 10_000, 10_000 * 25_000),
        result("small-files", "blobmount-2p", 20.0, 10_000, 10_000 * 25_000),
        result("large-sequential", "blobmount", 0.0, 1, 2 * GiB),
        result("large-sequential", "blobmount-2p", 1.0, 1, 2 * GiB),
    ]
    text = "\n".join(projection_lines(results))
    assert f"{NODE_CORES}-core node" in text
    # 1.2 and 2.2 ms per file; 16 / 2.2 ms = 7,273 files/s, 8 / 2.2 ms = 3,636; no serial
    # part measured (a daemon that lists no processes): no bound from it
    assert "| 1.200 ms | 2.200 ms | - | 7,273 | 3,636 |" in text
    # 1.0 and 1.5 s per GiB; 16 / 1.5 = 10.7 GiB/s; one stream 1 / 1.0 s
    assert "| 1.00 s | 1.50 s | - | 10.7 | 5.3 |" in text
    assert "near 1.0 GiB/s" in text
    assert "Assumptions" in text


def test_no_section_without_a_two_process_row_or_with_unverified_bytes() -> None:
    assert projection_lines([result("small-files", "blobmount", 1.0, 10, 250)]) == []
    bad = result("small-files", "blobmount-2p", 1.0, 10, 250)
    bad.runs[1].verified = False
    assert projection_lines([bad]) == []


def test_the_measured_serial_part_bounds_the_rate_whatever_the_cores() -> None:
    results = [
        # 0.5 s of serial CPU over 10,000 files: 0.05 ms, so at most 20,000 files/s
        result("small-files", "blobmount-2p", 2.0, 10_000, 10_000 * 25_000, serial_s=0.5),
        result("large-sequential", "blobmount-2p", 1.0, 1, 2 * GiB),
        # 0.2 s over 2 GiB: 0.1 s per GiB, at most 10 GiB/s
        result("large-parallel", "blobmount-2p", 1.0, 1, 2 * GiB, serial_s=0.2),
    ]
    text = "\n".join(projection_lines(results))
    # 4 ms of tree CPU per file: 16 / 4 ms = 4,000 files/s, below the serial bound
    assert "| - | 0.400 ms | 0.050 ms | 20,000 | 20,000 |" in text
    # 1.5 s per GiB: 16 / 1.5 = 10.7 GiB/s, above the serial bound of 10; 8 / 1.5 = 5.3
    assert "| - | 1.50 s | 0.100 s | 10.0 | 5.3 |" in text
