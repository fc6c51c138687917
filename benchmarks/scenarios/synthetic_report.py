"""The synthetic group's report: one row per scenario, system and process count (markdown,
printed, and JSON with every raw number).

Small-file scenarios are measured per file (files/s, CPU ms per file), large-file ones per GiB
(GiB/s, CPU s per GiB). "tree" is the daemon's whole process tree, "main" its first process
alone: with one process they are the same, with several the main process's share is the serial
part issue #25 wants small. A row per `--processes` value: today's daemon always runs 1.
"""

from __future__ import annotations

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
    "CPU, main process | switches, tree | time per file, 1 reader | harness CPU | other CPU | "
    "GETs | peak RSS, main | verified |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
)

LEGEND = """\
- **rate**: files/s (S3 shapes) or GiB/s (S1, S2); **vs ceiling** = ceiling time / mount time.
  The ceiling is `SyntheticStorageClient` called in the harness process, no FUSE: the cost of
  making the bytes up, so every mount ratio is small; what matters is the CPU columns.
- **CPU, tree**: CPU seconds (user + system) of the daemon and every process under it during
  the timed part, per file (ms) or per GiB (s); for the ceiling, the harness's CPU.
  **CPU, main process**: the daemon's first process alone, the serial part of a multi-process
  mount (the same as the tree with one process). "n lost": processes that exited mid-run.
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
        return f"| {name} | {row.system} | | error: {(row.error or '')[:160]} |" + " |" * 11
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
            f"1.00 (ref) | {row.per_unit(cpu)} (harness) | - | - | {latency} | - | - | - | - | "
            f"{ok} |"
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
        f"{row.switches(usage)} | {latency} | {usage.harness_cpu_s / seconds:.2f} | "
        f"{usage.others_cpu_s / seconds:.2f} | "
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
    lines += ["", LEGEND, "", "## Scenarios", ""]
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
