"""The run's report: the machine (scenarios/machine.py), the datasets, and one row per
scenario and system.

Written as markdown (also printed) and as JSON with every raw number. Ratios are to the
scenario's "ceiling" system: ceiling time / system time, so 1.00 means "as fast as fetching the
same bytes directly with the same client", and 0.50 means half as fast.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scenarios.base import KEPT_SUFFIX, Scenario
from scenarios.machine import machine_line
from scenarios.plans import GiB, Phase
from scenarios.projection import projection_lines
from scenarios.results import RunMetrics, SystemResult

log = logging.getLogger(__name__)

MB = 1_000_000


@dataclass
class ScenarioReport:
    scenario: Scenario
    systems: list[SystemResult] = field(default_factory=list)
    error: str | None = None
    #: the mount plan's phases, when it has them (multi-epoch)
    phases: tuple[Phase, ...] = ()

    def ceiling_seconds(self) -> float | None:
        # the ceiling's median run, as each row shows and divides by its own median run: with
        # an even --repeat, an interpolated median here against the slower middle run there
        # made every ratio look worse than the times in the same table
        for result in self.systems:
            if result.system == "ceiling" and result.verified and result.median is not None:
                return result.median.seconds
        return None

    def as_json(self) -> dict[str, Any]:
        s = self.scenario
        return {
            "number": s.number,
            "name": s.name,
            "title": s.title,
            "settings": dict(s.mount_env),
            "settings_note": s.settings_note,
            "todo": s.todo,
            "error": self.error,
            "phases": [p.name for p in self.phases],
            "systems": [r.as_json() for r in self.systems],
        }


@dataclass
class RunReport:
    profile: str
    started: str
    machine: dict[str, Any]
    args: list[str]
    finished: str | None = None
    datasets: list[dict[str, Any]] = field(default_factory=list)
    scenarios: list[ScenarioReport] = field(default_factory=list)
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "started": self.started,
            "finished": self.finished,
            "interrupted": self.interrupted,
            "args": self.args,
            "machine": self.machine,
            "datasets": self.datasets,
            "scenarios": [s.as_json() for s in self.scenarios],
            "notes": self.notes,
        }

    def write(self, out_dir: Path, stamp: str) -> tuple[Path, Path]:
        """Write <stamp>-<profile>.md/.json and latest.md/.json; returns the two stamped paths."""
        out_dir.mkdir(parents=True, exist_ok=True)
        md_path = out_dir / f"{stamp}-{self.profile}.md"
        json_path = out_dir / f"{stamp}-{self.profile}.json"
        markdown = to_markdown(self)
        data = json.dumps(self.as_json(), indent=2, default=str) + "\n"
        for path, text in (
            (md_path, markdown),
            (json_path, data),
            (out_dir / "latest.md", markdown),
            (out_dir / "latest.json", data),
        ):
            path.write_text(text)
        return md_path, json_path

    def contention(self) -> float:
        """The most cores anything outside the benchmark used, on average, during any run."""
        worst = 0.0
        for sr in self.scenarios:
            for result in sr.systems:
                for run in result.runs:
                    if run.others_cpu_s is not None and run.seconds > 0:
                        worst = max(worst, run.others_cpu_s / run.seconds)
        return worst


#: above this many cores used by others during a run, the report warns that figures are noisy
BUSY_OTHERS_CORES = 0.3


# -- results table -----------------------------------------------------------------------------


def _throughput(result: SystemResult, seconds: float) -> str:
    mbps = result.requested_bytes / MB / seconds
    if result.files > 1:
        return f"{result.files / seconds:,.0f} files/s ({mbps:,.1f} MB/s)"
    return f"{mbps:,.0f} MB/s"


def listing_speed(result: SystemResult, run: RunMetrics) -> str:
    marks = ", ".join(f"{label} {s:.2f} s" for label, s in run.listing.items())
    return f"{result.files / run.seconds:,.0f} entries/s ({marks})"


def _requests(storage: dict[str, int]) -> str:
    if "range_requests" not in storage:
        return f"{storage['list_requests']:,} list" if "list_requests" in storage else "-"
    text = f"{storage['range_requests']:,} GET"
    extra = [
        f"{storage[key]:,} {label}"
        for key, label in (("properties_requests", "HEAD"), ("list_requests", "list"))
        if storage.get(key)
    ]
    return text + (f" + {' + '.join(extra)}" if extra else "")


def _row(number: int, scenario: str, result: SystemResult, ceiling_s: float | None) -> str:
    run = result.median
    if result.error and run is None:
        first = result.error.strip().splitlines()[0][:160]
        return f"| {number} | {scenario} | {result.system} | error: {first} |" + " |" * 9
    assert run is not None
    seconds = run.seconds
    gib = result.requested_bytes / GiB
    if result.system == "ceiling":
        ratio = "1.00 (ref)"
    elif ceiling_s:
        ratio = f"{ceiling_s / seconds:.2f}"
    else:
        ratio = "-"
    cpu = f"{run.client_cpu_s / gib:.2f}" if run.client_cpu_s is not None and gib else "-"
    rss = f"{run.peak_rss_bytes / 2**20:,.0f} MiB" if run.peak_rss_bytes else "-"
    fetched = run.storage.get("range_bytes")
    amplification = f"{fetched / result.requested_bytes:.2f}" if fetched is not None else "-"
    az = f"{run.azurite_cpu_s / seconds:.2f}" if run.azurite_cpu_s is not None else "-"
    if run.proxy_cpu_s is not None:
        az += f" (+{run.proxy_cpu_s / seconds:.2f} proxy)"
    others = f"{run.others_cpu_s / seconds:.2f}" if run.others_cpu_s is not None else "-"
    if result.error:
        ok = "error"
    elif result.verified:
        ok = "yes"
    else:
        bad = [r.mismatch_at for r in result.runs if not r.verified]
        ok = f"**NO** (first bad byte {bad[0]})"
    runs = f" (median of {len(result.runs)})" if len(result.runs) > 1 else ""
    throughput = listing_speed(result, run) if run.listing else _throughput(result, seconds)
    return (
        f"| {number} | {scenario} | {result.system} | {seconds:.2f}{runs} | "
        f"{throughput} | {ratio} | {cpu} | {rss} | {amplification} | "
        f"{_requests(run.storage)} | {az} | {others} | {ok} |"
    )


#: issue #9 compares the multi-epoch total with rclone's full cache mode
PEER = "rclone-full"


def _phase_table(sr: ScenarioReport) -> list[str]:
    """Per-phase times of a scenario with phases: each phase outside the total (the listing),
    the first and last phases of the total, the total, first/last, and what was fetched."""
    apart = [p.name for p in sr.phases if not p.in_total]
    counted = [p.name for p in sr.phases if p.in_total]
    if not counted:
        return []
    first, last = counted[0], counted[-1]
    totals = {r.system: r.median.seconds for r in sr.systems if r.median and r.median.phases}
    ceiling_s = totals.get("ceiling")
    kept = any(name.endswith(KEPT_SUFFIX) for name in totals)
    lines = [
        f"**{sr.scenario.number}. {sr.scenario.name}, phase by phase** (median run; caches "
        "dropped before each phase"
        + (
            f"; `{KEPT_SUFFIX}` rows: dropped before the run only, as a training job's node "
            f"would keep them, and compared with {PEER}{KEPT_SUFFIX}"
            if kept
            else ""
        )
        + "):",
        "",
        "| system | "
        + "".join(f"{name} (s) | " for name in apart)
        + f"first: {first} (s) | last: {last} (s) | total (s) | first / last | "
        f"total vs ceiling | total vs {PEER} | fetched first / last phase |",
        "|---|" + "---:|" * (len(apart) + 6) + "---|",
    ]
    for result in sr.systems:
        run = result.median
        if run is None or not run.phases:
            continue
        times = run.phases
        # a system that keeps the kernel's caches is compared with the peer that does too
        kept_row = result.system.endswith(KEPT_SUFFIX)
        peer_s = totals.get(PEER + KEPT_SUFFIX if kept_row else PEER)
        fetched = [run.phase_storage.get(name, {}) for name in (first, last)]
        if all("range_bytes" in f for f in fetched):
            traffic = " / ".join(
                f"{f['range_bytes'] / MB:,.1f} MB"
                + (f" ({f['range_requests']:,} GET)" if "range_requests" in f else "")
                for f in fetched
            )
        else:
            traffic = "-"
        lines.append(
            f"| {result.system} | "
            + "".join(f"{times[name]:.2f} | " for name in apart)
            + f"{times[first]:.2f} | {times[last]:.2f} | {run.seconds:.2f} | "
            f"{times[first] / times[last]:.2f} | "
            + (f"{ceiling_s / run.seconds:.2f} | " if ceiling_s else "- | ")
            + (f"{peer_s / run.seconds:.2f} | " if peer_s else "- | ")
            + f"{traffic} |"
        )
    every = ", ".join(
        f"{r.system} " + " ".join(f"{r.median.phases[n]:.2f}" for n in counted)
        for r in sr.systems
        if r.median and r.median.phases
    )
    return [*lines, "", f"Every phase of the total, in seconds: {every}.", ""]


HEADER = (
    "| # | scenario | system | time (s) | throughput | vs ceiling | client CPU s/GiB | "
    "peak RSS | fetched / requested | storage requests | Azurite CPU | other CPU | verified |\n"
    "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|"
)

LEGEND = """\
How to read this (docs/BENCHMARKING.md has the details):

- **vs ceiling** = ceiling time / system time: 1.00 is as fast as the same bytes fetched directly
  with the same `AzureStorageClient` at high concurrency into memory; 0.50 is half as fast.
  `ceiling-2MiB` is a diagnostic: the ceiling done with the mount's own request shape;
  `blobmount-8MiB` is a diagnostic: the mount with 8 MiB blocks (same read-ahead bytes).
  The ceiling is this Python client's best, not the backend's: rclone's Go client can beat it.
- **rclone-off / rclone-full**: `rclone mount` of the same container with `--vfs-cache-mode off`
  or `full`, other options default, measured as blobmount is (fetched bytes from its `core/stats`).
- **download** rows: `blobmount download` in a subprocess, timed by its own `elapsed_s` (listing
  to data on disk); `download-local` is its local side alone (from an in-memory store).
- **client CPU s/GiB**: CPU seconds of the process that moved the data per GiB read (the mount's
  daemon, the download process; for ceilings, the harness process running the client).
- **peak RSS**: the daemon's (download process') VmHWM (a fresh one per run).
- **fetched / requested**: bytes GET from storage (`blobmount stats --json`: storage.range_bytes)
  over bytes the readers asked for; above 1 is read-ahead or block rounding that was not used.
- **Azurite CPU / other CPU**: average cores used during the timed part by Azurite, and by
  everything else on the machine (other users, kernel threads). The machine has 2 cores in all:
  Azurite near 1.0 means the emulator was the bottleneck; high "other" means the figure is noisy.
  "(+x proxy)": a scenario with added latency also ran the delay proxy, which used x cores.
- **listing** rows (scenario 6): the time is the whole listing (or walk); throughput is entries
  per second, with the seconds to the first entry and to the milestones; storage requests are
  list requests.
- MB = 10^6 bytes."""


def _startup(result: SystemResult) -> str:
    """What `mount_s` (time outside the timed part) was for this system."""
    if result.system.startswith("download"):
        return "interpreter start, credentials and exit (not timed)"
    return "mounted in"


def to_markdown(report: RunReport) -> str:
    lines = [
        f"# blobmount benchmark: {report.profile} run",
        "",
        f"Started {report.started}, finished {report.finished or '(not finished)'}"
        + (" - **interrupted**" if report.interrupted else "")
        + f". Command: `{' '.join(report.args)}`",
        "",
        "## Machine",
        "",
        *machine_line(report.machine),
        "",
    ]
    if report.datasets:
        lines += ["## Datasets (generated and uploaded once per run)", ""]
        for d in report.datasets:
            how = d.get("how", f"uploaded in {d['upload_s']} s (one Put Blob each)")
            lines.append(
                f"- {d['dataset']}: {d['blobs']:,} blob(s), {d['bytes'] / MB:,.0f} MB; "
                f"generated in {d['generate_s']} s, {how}"
            )
        lines.append("")
    lines += ["## Results", "", HEADER]
    for sr in report.scenarios:
        s = sr.scenario
        if s.todo:
            lines.append(f"| {s.number} | {s.name} | - | TODO: {s.todo} |" + " |" * 9)
            continue
        if sr.error and not sr.systems:
            lines.append(f"| {s.number} | {s.name} | - | error: {sr.error[:160]} |" + " |" * 9)
            continue
        ceiling_s = sr.ceiling_seconds()
        lines.extend(_row(s.number, s.name, r, ceiling_s) for r in sr.systems)
    lines.append("")
    for sr in report.scenarios:
        lines.extend(_phase_table(sr))
    lines += [LEGEND, "", "## Scenarios and systems", ""]
    for sr in report.scenarios:
        s = sr.scenario
        lines.append(f"**{s.number}. {s.name}**: {s.title}.")
        if s.todo:
            lines += [f"TODO: {s.todo}.", ""]
            continue
        settings = " ".join(f"{k}={v}" for k, v in s.mount_env.items()) or "(defaults)"
        lines.append(f"Mount settings: `{settings}` ({s.settings_note}).")
        lines.extend(
            f"- {r.system}: {r.description}"
            + (f"; caches {r.cache_drop}" if r.settings else "")
            + (f"; {_startup(r)} {r.median.mount_s:.2f} s" if r.median and r.median.mount_s else "")
            for r in sr.systems
        )
        for r in sr.systems:
            if r.error:
                lines += [f"- **{r.system} failed**:", "", "```", r.error.strip()[:3000], "```"]
        lines.append("")
    lines += projection_lines(r for sr in report.scenarios for r in sr.systems)
    if report.notes:
        lines += ["## Notes", "", *(f"- {note}" for note in report.notes), ""]
    return "\n".join(lines)
