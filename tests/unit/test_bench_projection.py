"""The report's projected per-mount ceiling (benchmarks/scenarios/projection.py): Amdahl's
bound from the run's 2-process CPU per file and per GiB, with its assumptions."""

from __future__ import annotations

from scenarios.plans import GiB
from scenarios.projection import NODE_CORES, projection_lines
from scenarios.results import RunMetrics, SystemResult


def result(scenario: str, system: str, cpu_s: float, files: int, size: int) -> SystemResult:
    runs = [RunMetrics(seconds=s, verified=True, client_cpu_s=cpu_s + s) for s in (1.0, 2.0, 3.0)]
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
    # 1.2 and 2.2 ms per file; 16 / 2.2 ms = 7,273 files/s, 8 / 2.2 ms = 3,636
    assert "| 1.200 ms | 2.200 ms | 7,273 | 3,636 |" in text
    # 1.0 and 1.5 s per GiB; 16 / 1.5 = 10.7 GiB/s; one stream 1 / 1.0 s
    assert "| 1.00 s | 1.50 s | 10.7 | 5.3 |" in text
    assert "near 1.0 GiB/s" in text
    assert "Assumptions" in text


def test_no_section_without_a_two_process_row_or_with_unverified_bytes() -> None:
    assert projection_lines([result("small-files", "blobmount", 1.0, 10, 250)]) == []
    bad = result("small-files", "blobmount-2p", 1.0, 10, 250)
    bad.runs[1].verified = False
    assert projection_lines([bad]) == []
