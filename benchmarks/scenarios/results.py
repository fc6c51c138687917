"""What a run of a system measured, and a system's runs in a scenario (what the report shows).

`RunMetrics` is one timed, verified run; `PhasedRun` what the timed part of a run with phases
measured phase by phase; `SystemResult` a system's runs in one scenario, with their median.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from scenarios.plans import Phase
from scenarios.serial_part import SerialPart


@dataclass
class RunMetrics:
    """One timed run of one system."""

    seconds: float
    verified: bool
    #: CPU seconds of the process that moved the data: the daemon, or (ceiling) this process
    client_cpu_s: float | None = None
    harness_cpu_s: float | None = None
    azurite_cpu_s: float | None = None
    #: the delay proxy's, when the scenario has one (scenarios/delay_proxy.py)
    proxy_cpu_s: float | None = None
    others_cpu_s: float | None = None
    peak_rss_bytes: int | None = None
    rss_after_mount_bytes: int | None = None
    mount_s: float | None = None
    #: storage requests during the timed part (from `blobmount stats --json`, or counted)
    storage: dict[str, int] = field(default_factory=dict)
    stats_after: dict[str, Any] | None = None
    #: the mount's serial part over the timed part (scenarios/serial_part.py), when it lists
    #: its processes
    serial: SerialPart | None = None
    profile_file: str | None = None
    #: where the first wrong byte was (blob and range), for a run that failed verification
    mismatch_at: str | None = None
    #: a listing's milestones: label ("first", "50,000th") -> seconds from the start
    listing: dict[str, float] = field(default_factory=dict)
    #: a plan with phases: seconds of each phase, and (for a mount with counters) its requests
    phases: dict[str, float] = field(default_factory=dict)
    phase_storage: dict[str, dict[str, int]] = field(default_factory=dict)
    #: free memory written once and freed just before the run (guest_memory.py), untimed
    prefault_bytes: int = 0
    prefault_s: float = 0.0


@dataclass
class PhasedRun:
    """What the timed part of one run measured, phase by phase."""

    #: the run's time: the phases in the total
    seconds: float = 0.0
    #: each phase's seconds, kept only for a plan with phases
    phases: dict[str, float] = field(default_factory=dict)
    phase_storage: dict[str, dict[str, int]] = field(default_factory=dict)
    #: the daemon's counters after the last phase
    stats_after: dict[str, Any] | None = None
    #: the first listing phase that did not find exactly the dataset's files
    listing_mismatch: str | None = None

    def add(self, phase: Phase, seconds: float, keep: bool) -> None:
        if phase.in_total:
            self.seconds += seconds
        if keep:
            self.phases[phase.name] = seconds


@dataclass
class SystemResult:
    """A system in a scenario: its runs (or the error that stopped it)."""

    scenario: str
    system: str
    kind: str  # "ceiling", "diagnostic" or "mount"
    description: str
    requested_bytes: int
    files: int
    settings: dict[str, str] = field(default_factory=dict)
    runs: list[RunMetrics] = field(default_factory=list)
    error: str | None = None
    cache_drop: str = ""

    @property
    def median(self) -> RunMetrics | None:
        """The run with the median time (the slower middle one for an even count)."""
        if not self.runs:
            return None
        ordered = sorted(self.runs, key=lambda r: r.seconds)
        return ordered[len(ordered) // 2]

    @property
    def seconds(self) -> float | None:
        return statistics.median(r.seconds for r in self.runs) if self.runs else None

    @property
    def verified(self) -> bool:
        return bool(self.runs) and all(r.verified for r in self.runs)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["seconds_median"] = self.seconds
        out["verified"] = self.verified
        return out


def storage_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, int]:
    """The storage counters that grew from one `blobmount stats --json` to a later one."""
    if not before or not after:
        return {}
    b, a = before.get("storage", {}), after.get("storage", {})
    return {
        key: a[key] - b.get(key, 0)
        for key in ("range_requests", "range_bytes", "properties_requests", "list_requests")
        if isinstance(a.get(key), int)
    }
