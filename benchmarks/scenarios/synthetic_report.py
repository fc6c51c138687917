"""The synthetic group's report: one row per scenario, system and process count (markdown,
printed, and JSON with every raw number).

Small-file scenarios are measured per file (files/s, CPU ms per file), large-file ones per GiB
(GiB/s, CPU s per GiB). "tree" is the daemon's whole process tree, "main" its first process
alone, and "serial part" what of it does not spread over more processes
(`scenarios.serial_part`: with one process, everything), which issue #25 wants small. A row
per `--processes` value. Below the table, what more processes could reach on this machine at
best: the 1-process run's busy cores set that bound (`machine_bound_lines`).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from scenarios.plans import GiB, MiB
from scenarios.process_tree import TreeUsage
from scenarios.synthetic_group import SyntheticScenario
from scenarios.synthetic_mount import MountRun


@dataclass
class Row:
    """One system in one scenario: its runs, or the error that stopped it."""

    scenario: SyntheticScenario
    system: str
    #: the processes asked for; None for the ceiling
    processes: int | None
    files: int
    requested_bytes: int
    #: (seconds, CPU seconds) of each ceiling run
    ceiling_runs: list[tuple[float, float]] = field(default_factory=list)
    mount_runs: list[MountRun] = field(default_factory=list)
    verified: bool = True
    error: str | None = None

    @property
    def runs(self) -> int:
        return len(self.ceiling_runs) + len(self.mount_runs)

    @property
    def seconds(self) -> float | None:
        times = [s for s, _ in self.ceiling_runs] + [r.seconds for r in self.mount_runs]
        return statistics.median(times) if times else None

    def median_mount(self) -> MountRun | None:
        """The mount run with the median time (the slower middle one for an even count)."""
        if not self.mount_runs:
            return None
        return sorted(self.mount_runs, key=lambda r: r.seconds)[len(self.mount_runs) // 2]

    def rate(self, seconds: float) -> str:
        if self.scenario.kind == "small":
            return f"{self.files / seconds:,.0f} files/s"
        return f"{self.requested_bytes / GiB / seconds:.2f} GiB/s"

    def per_unit(self, cpu_s: float) -> str:
        """CPU per file (ms) for small files, per GiB (s) for the large file."""
        if self.scenario.kind == "small":
            return f"{1000 * cpu_s / self.files:.3f} ms/file"
        return f"{cpu_s / (self.requested_bytes / GiB):.3f} s/GiB"

    def serial(self, run: MountRun) -> str:
        """The run's serial part per file or GiB, and its two terms."""
        part = run.serial
        if part is None:
            return "-"
        if part.processes == 1:
            return f"{self.per_unit(part.total_s)} (all)"
        if part.main_share == 1.0:
            return f"{self.per_unit(part.total_s)} (one stream: all its opener's)"
        work = "requests" if self.scenario.kind == "small" else "bytes"
        return (
            f"{self.per_unit(part.total_s)} (main {self.per_unit(part.main_extra_s)} beyond its "
            f"{part.main_share:.0%} of the {work}; locks {self.per_unit(part.locks_s)})"
        )

    def switches(self, usage: TreeUsage) -> str:
        """The tree's waits / preemptions per file (small files) or per MiB (the large file)."""
        if self.scenario.kind == "small":
            per, unit = self.files, "file"
        else:
            per, unit = self.requested_bytes / MiB, "MiB"
        if not per:
            return "-"
        voluntary, involuntary = usage.voluntary_switches / per, usage.involuntary_switches / per
        return f"{voluntary:.2f} / {involuntary:.2f} per {unit}"

    def summary(self) -> str:
        """The last run, for the log."""
        if self.mount_runs:
            run = self.mount_runs[-1]
            return (
                f"{self.system}: {run.seconds:.3f} s, {self.rate(run.seconds)}, tree CPU "
                f"{self.per_unit(run.usage.tree_cpu_s)}, {run.usage.processes} process(es), "
                f"verified={run.verified}"
            )
        seconds = self.ceiling_runs[-1][0] if self.ceiling_runs else 0.0
        return f"{self.system}: {seconds:.3f} s, {self.rate(seconds)}, verified={self.verified}"


HEADER = (
    "| scenario | system | processes | time (s) | rate | vs ceiling | CPU, tree | "
    "CPU, main process | serial part | switches, tree | time per file, 1 reader | harness CPU | "
    "other CPU | GETs | peak RSS, main | verified |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
)

LEGEND = """\
- **rate**: files/s (S3 shapes) or GiB/s (S1, S2); **vs ceiling** = ceiling time / mount time.
  The ceiling is `SyntheticStorageClient` called in the harness process, no FUSE: the cost of
  making the bytes up, so every mount ratio is small; what matters is the CPU columns.
- **CPU, tree**: CPU seconds (user + system) of the daemon and every process under it during
  the timed part, per file (ms) or per GiB (s); for the ceiling, the harness's CPU.
  **CPU, main process**: the daemon's first process alone (the same as the tree with one
  process); with several it serves its share of the requests like the others.
  "n lost": processes that exited mid-run.
- **serial part**: the CPU that does not spread over more processes (issue #25's target: at
  most 0.05 ms per file and 0.05 s per GiB): with one process all of it; with several, the
  main process's CPU beyond what its share of the requests costs the other processes (below
  zero is noise, counted as 0) plus the time any process held the locks all of them take in
  turn (scenarios/serial_part.py).
- **switches, tree**: context switches of the tree's threads per file (S3) or per MiB (S1, S2):
  waits / preemptions. Preemptions mean the machine has fewer cores than busy threads: each
  costs the preempted process its warm caches, so its CPU per file rises.
- **processes**: processes in the daemon's tree (asked for with DATASET_MOUNT_WORKER_PROCESSES).
- **time per file, 1 reader**: wall time per file with one reader: a cold file's latency.
- **harness CPU / other CPU**: average cores used by the reader threads, and by everything else
  on the machine (2 cores in all here: high "other" means noisy figures)."""


def _line(row: Row, ceiling_s: float | None) -> str:
    name = row.scenario.name
    seconds = row.seconds
    if seconds is None:
        return f"| {name} | {row.system} | | error: {(row.error or '')[:160]} |" + " |" * 12
    runs = f" (median of {row.runs})" if row.runs > 1 else ""
    latency = "-"
    if row.scenario.kind == "small" and row.scenario.readers == 1:
        latency = f"{1000 * seconds / row.files:.3f} ms"
    ok = "error" if row.error else ("yes" if row.verified else "**NO**")
    run = row.median_mount()
    if run is None:
        cpu = statistics.median(c for _, c in row.ceiling_runs)
        return (
            f"| {name} | {row.system} | - | {seconds:.3f}{runs} | {row.rate(seconds)} | "
            f"1.00 (ref) | {row.per_unit(cpu)} (harness) | - | - | - | {latency} | - | - | - | "
            f"- | {ok} |"
        )
    usage = run.usage
    processes = str(usage.processes)
    if usage.processes != row.processes:
        processes += f" (asked {row.processes})"
    ratio = f"{ceiling_s / seconds:.3f}" if ceiling_s else "-"
    lost = f", {usage.lost} lost" if usage.lost else ""
    gets = f"{run.storage['range_requests']:,}" if "range_requests" in run.storage else "-"
    rss = f"{run.peak_rss_bytes / MiB:,.0f} MiB" if run.peak_rss_bytes else "-"
    return (
        f"| {name} | {row.system} | {processes} | {seconds:.3f}{runs} | {row.rate(seconds)} | "
        f"{ratio} | {row.per_unit(usage.tree_cpu_s)}{lost} | {row.per_unit(usage.root_cpu_s)} | "
        f"{row.serial(run)} | {row.switches(usage)} | {latency} | "
        f"{usage.harness_cpu_s / seconds:.2f} | {usage.others_cpu_s / seconds:.2f} | "
        f"{gets} | {rss} | {ok} |"
    )


def to_markdown(rows: list[Row], meta: dict[str, Any], machine: list[str]) -> str:
    lines = [
        f"# blobmount synthetic-source benchmark: {meta['profile']} run",
        "",
        f"Started {meta['started']}, finished {meta.get('finished', '(not finished)')}"
        + (" - **interrupted**" if meta.get("interrupted") else "")
        + f". Command: `{' '.join(meta['args'])}`. Source: `{meta['uri']}`.",
        "",
        "## Machine",
        "",
        *machine,
        "",
        "## Results",
        "",
        HEADER,
    ]
    ceilings = {
        r.scenario.name: r.seconds for r in rows if r.processes is None and r.verified and r.runs
    }
    lines += [_line(row, ceilings.get(row.scenario.name)) for row in rows]
    lines += ["", LEGEND, "", *machine_bound_lines(rows), "## Scenarios", ""]
    seen: set[str] = set()
    for row in rows:
        s = row.scenario
        if s.name in seen:
            continue
        seen.add(s.name)
        settings = " ".join(f"{k}={v}" for k, v in s.mount_env.items()) or "(defaults)"
        lines.append(f"- **{s.name}**: {s.title}. Mount settings: `{settings}`.")
    errors = [r for r in rows if r.error]
    for r in errors:
        lines += ["", f"**{r.scenario.name} / {r.system} failed**:", "", "```"]
        lines += [r.error.strip()[:3000] if r.error else "", "```"]
    return "\n".join(lines) + "\n"


def busy_cores(run: MountRun) -> float:
    """Cores the whole machine kept busy during a run: the daemon's tree, the readers and the
    rest."""
    usage = run.usage
    return (usage.tree_cpu_s + usage.harness_cpu_s + usage.others_cpu_s) / usage.wall_s


def machine_bound_lines(rows: list[Row], cores: int | None = None) -> list[str]:
    """The most a mount of N processes can reach on this machine, per scenario, against what
    it reached: a second process never makes a file cost less CPU than one process spends (it
    adds the wake-ups and tables of its own), so if the 1-process run kept `b` of the
    machine's `C` cores busy, N processes reach at most min(N, C / b) times its rate."""
    cores = cores or len(os.sched_getaffinity(0))
    one = {r.scenario.name: r for r in rows if r.processes == 1 and r.verified}
    more = [r for r in rows if r.processes and r.processes > 1 and r.verified]
    table = []
    for row in more:
        base = one.get(row.scenario.name)
        base_run, run = (base.median_mount() if base else None), row.median_mount()
        if base is None or base_run is None or run is None or not base.seconds or not row.seconds:
            continue
        busy = busy_cores(base_run)
        bound = min(float(row.processes or 1), cores / busy)
        table.append(
            f"| {row.scenario.name} | {row.processes} | {busy:.2f} of {cores} | {bound:.2f}x | "
            f"{base.seconds / row.seconds:.2f}x |"
        )
    if not table:
        return []
    return [
        f"## What more processes can reach on this machine ({cores} cores)",
        "",
        "A second process never makes a file cost less CPU than one process spends, so the "
        "busy cores of the 1-process run (the daemon's tree, the readers, the rest of the "
        "machine) bound the rate of N processes here at min(N, cores / busy) times the "
        "1-process rate, whatever the design; a bigger machine lifts it (the projection).",
        "",
        "| scenario | processes | 1-process run: busy cores | bound here | measured |",
        "|---|---:|---:|---:|---:|",
        *table,
        "",
    ]


def to_json(rows: list[Row], meta: dict[str, Any]) -> dict[str, Any]:
    out = []
    for row in rows:
        item = asdict(row)
        item["scenario"] = {
            "name": row.scenario.name,
            "kind": row.scenario.kind,
            "readers": row.scenario.readers,
            "settings": dict(row.scenario.mount_env),
        }
        item["seconds_median"] = row.seconds
        out.append(item)
    return {**meta, "rows": out}
