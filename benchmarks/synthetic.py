"""The synthetic group: blobmount on a synthetic:// source, where the mount is the bottleneck.

    python benchmarks/synthetic.py [--quick] [--scenario NAME ...] [--processes N ...]
                                   [--repeat R] [--out DIR]

No Azurite: the daemon makes the data up itself (`blobmount.storage.synthetic`), so the
figures are the mount's own cost on this machine. For each scenario (S3: 25 KB files read by 16,
4 and 1 readers; S1: the large file by one reader; S2: by 8 readers, each its own part), the
ceiling (the same GETs on `SyntheticStorageClient` in this process, no FUSE) and then, for each
`--processes` value, a fresh mount, rounds interleaved. Reported per run (median of --repeat):
files/s or GiB/s, the ratio to the ceiling, and the CPU per file and per GiB of the daemon's
whole process tree and of its main process (the serial part). Every byte is verified.

`--processes N` sets DATASET_MOUNT_WORKER_PROCESSES=N for the daemon (issue #25); the report
shows how many processes the daemon really ran (the N that serve, and the zygote that replaces
a dead one).
Writes synthetic-<stamp>-<profile>.md/.json and synthetic-latest.md/.json to --out
(benchmarks/results/); the markdown is printed. See docs/BENCHMARKING.md, "Synthetic source".
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
for _path in (str(REPO), str(BENCH_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from scenarios.machine import describe_machine, machine_line  # noqa: E402
from scenarios.plans import MiB  # noqa: E402
from scenarios.synthetic_group import (  # noqa: E402
    FULL,
    QUICK,
    SCENARIOS,
    dataset_of,
    dataset_uri,
    run_ceiling,
)
from scenarios.synthetic_mount import run_mount  # noqa: E402
from scenarios.synthetic_report import Row, to_json, to_markdown  # noqa: E402

log = logging.getLogger("synthetic")


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="benchmarks/synthetic.py", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--quick", action="store_true", help="5,000 small files, 256 MiB")
    parser.add_argument(
        "--scenario",
        action="append",
        choices=[s.name for s in SCENARIOS],
        help="run only these (repeatable)",
    )
    parser.add_argument(
        "--processes",
        action="append",
        type=int,
        metavar="N",
        help="mount with DATASET_MOUNT_WORKER_PROCESSES=N (repeatable; default: 1)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per system (median)")
    parser.add_argument("--small-files", type=int, metavar="N", help="number of small files")
    parser.add_argument("--large-mib", type=int, metavar="N", help="size of the large file")
    parser.add_argument("--run-timeout", type=float, default=600.0, metavar="S")
    parser.add_argument(
        "--no-prefault",
        dest="prefault",
        action="store_false",
        help="do not write once to the memory a run will take before it (see run.py)",
    )
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results")
    return parser


def run(args: argparse.Namespace, rows: list[Row], uri: str) -> None:
    """Every selected scenario: ceiling, then each process count, `--repeat` rounds."""
    dataset = dataset_of(uri)
    logs = args.out / "logs"
    for scenario in SCENARIOS:
        if args.scenario and scenario.name not in args.scenario:
            continue
        workload = scenario.workload(dataset)
        log.info("== %s: %s", scenario.name, scenario.title)
        mine = [
            Row(scenario, "ceiling", None, workload.files, workload.requested_bytes),
            *(
                Row(scenario, f"blobmount-p{n}", n, workload.files, workload.requested_bytes)
                for n in args.processes
            ),
        ]
        rows.extend(mine)
        for _ in range(args.repeat):
            for row in mine:
                if row.error:
                    continue
                try:
                    if row.processes is None:
                        ceiling = run_ceiling(dataset, workload.gets)
                        row.ceiling_runs.append((ceiling.seconds, ceiling.cpu_s))
                        row.verified &= ceiling.verified
                    else:
                        copy = logs / f"{scenario.name}-{row.system}-{len(row.mount_runs)}.log"
                        done = run_mount(
                            uri,
                            dataset,
                            scenario,
                            workload,
                            row.processes,
                            args.run_timeout,
                            copy,
                            args.prefault,
                        )
                        row.mount_runs.append(done)
                        row.verified &= done.verified
                except KeyboardInterrupt:
                    row.error = "interrupted"
                    raise
                except Exception as exc:
                    log.error("%s on %s failed: %s", row.system, scenario.name, exc)
                    row.error = f"{type(exc).__name__}: {exc}"
                    continue
                log.info("%s", row.summary())


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr
    )
    args = _parser().parse_args(argv)
    args.processes = args.processes or [1]
    if args.repeat < 1 or min(args.processes) < 1:
        print("--repeat and --processes must be at least 1", file=sys.stderr)
        return 2
    profile = QUICK if args.quick else FULL
    if args.small_files is not None or args.large_mib is not None:
        profile = dataclasses.replace(
            profile,
            name=f"{profile.name}-custom",
            small_files=args.small_files or profile.small_files,
            large_bytes=(args.large_mib or profile.large_bytes // MiB) * MiB,
        )
    uri = dataset_uri(profile)
    args.out = args.out.resolve()
    signal.signal(signal.SIGTERM, _raise_interrupt)
    started = datetime.datetime.now()
    meta: dict[str, Any] = {
        "profile": profile.name,
        "uri": uri,
        "started": started.isoformat(timespec="seconds"),
        "args": ["benchmarks/synthetic.py", *(argv if argv is not None else sys.argv[1:])],
        "repeat": args.repeat,
        "machine": describe_machine(REPO),
    }
    rows: list[Row] = []
    status = 0
    try:
        run(args, rows, uri)
    except KeyboardInterrupt:
        log.error("interrupted")
        meta["interrupted"] = True
        status = 130
    meta["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    markdown = to_markdown(rows, meta, machine_line(meta["machine"]))
    data = json.dumps(to_json(rows, meta), indent=2, default=str) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    for name in (f"synthetic-{stamp}-{profile.name}", "synthetic-latest"):
        (args.out / f"{name}.md").write_text(markdown)
        (args.out / f"{name}.json").write_text(data)
    print(markdown)
    if any(row.error or not row.verified for row in rows):
        status = status or 1
    return status


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
