"""Benchmark blobmount against the ceiling of its own storage client, on a private Azurite.

    python benchmarks/run.py [--quick] [--scenario NAME ...] [--out DIR] [--repeat N]

One run: generate each dataset the selected scenarios need (once) and upload it to an in-memory
Azurite of its own on a free loopback port; then, for every scenario, run each system on the same
workload: the ceiling (the same bytes fetched directly with `AzureStorageClient`, no FUSE) and a
fresh blobmount mount with the scenario's seed-recommended settings. Kernel caches are dropped
before every run (when permitted). Every read is verified against the generated source after the
clock stops. The markdown report is printed and written with the JSON to --out
(benchmarks/results/).

Mounts are always unmounted (fusermount3 -u, then -u -z) and every Azurite is stopped, on
errors and on Ctrl-C/SIGTERM too. See docs/BENCHMARKING.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
# the harness (scenarios/) and the test helpers it shares with the tests (tests/helpers/)
for _path in (str(REPO), str(BENCH_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from scenarios import discover  # noqa: E402
from scenarios.base import Bench, System, Workload  # noqa: E402
from scenarios.ceiling import run_ceiling_plan  # noqa: E402
from scenarios.datasets import Datasets  # noqa: E402
from scenarios.guest_memory import reported_free_memory_kib  # noqa: E402
from scenarios.machine import describe_machine  # noqa: E402
from scenarios.measure import ResourceMeter, drop_kernel_caches  # noqa: E402
from scenarios.plans import FULL, QUICK, CeilingPlan, MiB  # noqa: E402
from scenarios.report import BUSY_OTHERS_CORES, RunReport, ScenarioReport  # noqa: E402
from scenarios.results import SystemResult  # noqa: E402

log = logging.getLogger("bench")

#: memory written once before each run beyond the bytes it reads (see guest_memory.py)
PREFAULT_SLACK_BYTES = 1 << 30
#: GETs of the ceiling plan run once, untimed, before a scenario's first system (JIT warm-up)
WARMUP_GETS = 32


def _parser(names: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="benchmarks/run.py",
        description="Measure blobmount against the direct-client ceiling on a private Azurite.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller datasets (a few minutes in all)"
    )
    parser.add_argument(
        "--scenario",
        action="append",
        metavar="NAME",
        choices=names,
        help=f"run only these (repeatable): {', '.join(names)}",
    )
    parser.add_argument(
        "--system",
        action="append",
        metavar="NAME",
        help="run only these systems (repeatable): ceiling, ceiling-2MiB, blobmount, "
        "blobmount-8MiB, blobmount-ram0, rclone-off, rclone-full, download, and the variants "
        "a scenario adds (blobmount-whole-file, blobmount-1r, rclone-off-4r, ...)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=BENCH_DIR / "results",
        help="where to write the report (default: benchmarks/results/)",
    )
    parser.add_argument(
        "--large-mib", type=int, metavar="N", help="size of the large file in MiB (overrides)"
    )
    parser.add_argument(
        "--small-files", type=int, metavar="N", help="number of small files (overrides)"
    )
    parser.add_argument(
        "--seek-chunks", type=int, metavar="N", help="number of random chunks (overrides)"
    )
    parser.add_argument(
        "--epochs", type=int, metavar="N", help="epochs of the multi-epoch scenario (overrides)"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per system; the median is reported"
    )
    parser.add_argument(
        "--py-spy",
        action="store_true",
        help="record the daemon with py-spy during each mount run into <out>/profiles/ "
        "(collapsed stacks; adds overhead)",
    )
    parser.add_argument(
        "--run-timeout",
        type=float,
        metavar="S",
        help="give up on a run after S seconds (default: generous, from the workload's size)",
    )
    parser.add_argument(
        "--no-prefault",
        dest="prefault",
        action="store_false",
        help="do not write once to the memory a run will take before it runs (on a VM that "
        "hands free memory back to its host, first use of that memory is slow; "
        "docs/BENCHMARKING.md)",
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return parser


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _warm_up(bench: Bench, workload: Workload) -> None:
    """A few untimed GETs so Azurite's JIT has seen the request shape before the first system."""
    plan = workload.ceilings.get("ceiling")
    if plan is None:
        return
    first = plan.steps[0][:WARMUP_GETS]
    warm = CeilingPlan((first,), plan.concurrency, "warm-up")
    store = workload.store
    run_ceiling_plan(store, warm, ResourceMeter({}), 120.0)


def _summary(result: SystemResult) -> str:
    run = result.runs[-1]
    mbps = result.requested_bytes / 1e6 / run.seconds
    extra = f", {result.files / run.seconds:,.0f} files/s" if result.files > 1 else ""
    verdict = "verified" if run.verified else f"WRONG BYTES at {run.mismatch_at}"
    return f"{result.system}: {run.seconds:.2f} s, {mbps:,.0f} MB/s{extra}, {verdict}"


def run_scenario(bench: Bench, report: ScenarioReport, only_systems: set[str] | None) -> None:
    """Every system on the scenario's workload, `bench.repeat` rounds (systems interleaved).

    Fills `report` as it goes, so an interrupted run still reports what finished.
    """
    scenario = report.scenario
    log.info("== %d. %s: %s", scenario.number, scenario.name, scenario.title)
    try:
        workload = scenario.workload(bench.datasets, bench.profile)
    except Exception as exc:
        log.exception("preparing %s failed", scenario.name)
        report.error = f"{type(exc).__name__}: {exc}"
        return
    systems: list[System] = [
        s
        for s in scenario.systems(workload)
        if s.applies_to(workload) and (only_systems is None or s.name in only_systems)
    ]
    results = {
        s.name: SystemResult(
            scenario=scenario.name,
            system=s.name,
            kind=s.kind,
            description=s.describe(workload),
            requested_bytes=workload.requested_bytes,
            files=workload.files,
            settings=s.settings(scenario),
        )
        for s in systems
    }
    report.systems = list(results.values())
    report.phases = workload.mount.phases
    bench.datasets.run_only(workload.store.az)
    try:
        _warm_up(bench, workload)
    except Exception as exc:
        log.warning("warm-up failed: %s", exc)
    for round_no in range(bench.repeat):
        for system in systems:
            result = results[system.name]
            if result.error:
                continue
            if not workload.store.az.running:
                raise RuntimeError("Azurite is no longer running")
            result.cache_drop = drop_kernel_caches()
            bench.arm_prefault(memory_taken_by(workload))
            if bench.repeat > 1:
                log.info("%s, round %d of %d", system.name, round_no + 1, bench.repeat)
            try:
                run = system.run_once(bench, scenario, workload)
                if bench.last_prefault is not None:
                    run.prefault_bytes = bench.last_prefault.bytes
                    run.prefault_s = bench.last_prefault.seconds
                result.runs.append(run)
            except KeyboardInterrupt:
                result.error = "interrupted"
                raise
            except Exception as exc:
                log.error("%s on %s failed: %s", system.name, scenario.name, exc)
                result.error = f"{type(exc).__name__}: {exc}"
                continue
            log.info("%s", _summary(result))


def memory_taken_by(workload: Workload) -> int:
    """Memory a run may take fresh: the bytes it reads (into page cache, buffers or files)
    and room for the daemon or client."""
    return workload.requested_bytes + PREFAULT_SLACK_BYTES


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr
    )
    logging.getLogger("azure").setLevel(logging.WARNING)
    scenarios = discover()
    args = _parser([s.name for s in scenarios]).parse_args(argv)
    if args.list:
        for s in scenarios:
            state = f"TODO - {s.todo}" if s.todo else s.settings_note
            print(f"{s.number}. {s.name:18} {s.title}\n   {state}")
        return 0
    if args.repeat < 1:
        print("--repeat must be at least 1", file=sys.stderr)
        return 2
    for flag in ("large_mib", "small_files", "seek_chunks", "epochs"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            print(f"--{flag.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    selected = [s for s in scenarios if not args.scenario or s.name in args.scenario]
    profile = QUICK if args.quick else FULL
    overrides = {
        "large_file_bytes": None if args.large_mib is None else args.large_mib * MiB,
        "small_file_count": args.small_files,
        "seek_chunks": args.seek_chunks,
        "epochs": args.epochs,
    }
    if any(v is not None for v in overrides.values()):
        changed = {k: v for k, v in overrides.items() if v is not None}
        profile = dataclasses.replace(profile, name=f"{profile.name}-custom", **changed)
    only_systems = set(args.system) if args.system else None

    signal.signal(signal.SIGTERM, _raise_interrupt)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    report = RunReport(
        profile=profile.name,
        started=datetime.datetime.now().isoformat(timespec="seconds"),
        machine=describe_machine(REPO),
        args=["benchmarks/run.py", *(argv if argv is not None else sys.argv[1:])],
    )
    report.notes.append(
        f"sizes: large file {profile.large_file_bytes >> 20} MiB, "
        f"{profile.small_file_count:,} small files, {profile.seek_chunks:,} seek chunks, "
        f"{profile.epochs} epochs, {profile.medium_file_count} medium files"
    )
    out_dir: Path = args.out.resolve()
    datasets = Datasets(profile)
    bench = Bench(
        datasets, profile, out_dir, args.repeat, args.py_spy, args.run_timeout, args.prefault
    )
    status = 0
    started = time.monotonic()
    log.info("%s profile: %s", profile.name, report.notes[-1])
    try:
        for scenario in selected:
            if scenario.todo:
                log.info("== %d. %s: TODO slot, skipped", scenario.number, scenario.name)
                report.scenarios.append(ScenarioReport(scenario))
                continue
            scenario_report = ScenarioReport(scenario)
            report.scenarios.append(scenario_report)
            run_scenario(bench, scenario_report, only_systems)
            report.datasets = list(datasets.built)
            report.write(out_dir, stamp)  # partial results survive a later failure
    except KeyboardInterrupt:
        log.error("interrupted; cleaning up")
        report.interrupted = True
        status = 130
    except Exception as exc:
        log.exception("benchmark run failed")
        report.notes.append(f"run failed: {type(exc).__name__}: {exc}")
        status = 1
    finally:
        datasets.close()
    report.machine["reported_free_kib_at_end"] = reported_free_memory_kib()
    report.datasets = list(datasets.built)
    drops = {r.cache_drop for sr in report.scenarios for r in sr.systems if r.cache_drop}
    if drops - {"dropped"}:
        report.notes.append(f"kernel caches: {', '.join(sorted(drops))}")
    prefaults = [run for sr in report.scenarios for r in sr.systems for run in r.runs]
    if any(run.prefault_bytes for run in prefaults):
        report.notes.append(
            "before each run, up to "
            f"{max(run.prefault_bytes for run in prefaults) / 2**30:.1f} GiB of free memory was "
            "written once and freed, so that no system pays the host's faults on memory this VM "
            f"had handed back ({sum(run.prefault_s for run in prefaults):.0f} s in all, untimed; "
            "docs/BENCHMARKING.md, Known limits)"
        )
    busy = report.contention()
    if busy > BUSY_OTHERS_CORES:
        report.notes.append(
            f"the machine was busy with other work: up to {busy:.2f} of "
            f"{os.cpu_count()} cores were used outside the benchmark during a run (column "
            "'other CPU'); times are slower and noisier than on an idle machine. Compare "
            "ratios within a scenario (systems ran back to back) rather than absolute figures, "
            "and rerun with --repeat 3 on a quiet machine for figures to keep"
        )
    report.notes.append(f"whole run took {time.monotonic() - started:.0f} s")
    report.finished = datetime.datetime.now().isoformat(timespec="seconds")
    md_path, json_path = report.write(out_dir, stamp)
    print(md_path.read_text())
    log.info("wrote %s and %s", md_path, json_path)
    if any(r.error or (r.runs and not r.verified) for sr in report.scenarios for r in sr.systems):
        status = status or 1
    return status


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
