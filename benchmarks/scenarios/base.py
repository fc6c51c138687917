"""What a scenario is and what runs it: the two interfaces (`Scenario`, `System`), the
`Workload` a scenario hands its systems, and the run's shared state (`Bench`).

A scenario turns the run's datasets into a `Workload`: one `MountPlan` and one or more
`CeilingPlan`s (scenarios/plans.py) over one store, and the generated content of each blob,
which every run is verified against. It names the systems that run it; scenarios read through a
mount take the default lineup (`scenarios.lineup.MountScenario`).

Scenarios register themselves (see `scenarios/__init__.py`); the harness (`benchmarks/run.py`)
never names one. A scenario that is not built yet registers with `todo` set: it is listed and
reported as a TODO slot, never run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from scenarios.datasets import Datasets, Store
from scenarios.guest_memory import Prefault, prefault_free_memory
from scenarios.plans import CeilingPlan, MountPlan, Profile
from scenarios.results import RunMetrics

#: the settings and credentials a daemon or download must not inherit from the caller
FOREIGN_ENV = ("DATASET_", "AZURE_STORAGE", "AZUREML_", "RSLEX_")
#: a mount system that keeps the kernel's caches between phases is named with this suffix
KEPT_SUFFIX = "-kept"
KEPT_NOTE = "; kernel caches dropped before the run only, kept from phase to phase"


@dataclass(frozen=True, slots=True)
class Workload:
    """Everything the systems need to run one scenario, and what a correct run produces."""

    #: the Azurite and container holding the data (a mount's root is the container)
    store: Store
    #: bytes the readers ask for (= size of the result buffer)
    requested_bytes: int
    #: files opened (files/s is reported when this is more than one)
    files: int
    #: the generated content of a blob (what every read of it is compared with)
    source: Callable[[str], bytes] = field(repr=False)
    mount: MountPlan
    #: system name -> plan; "ceiling" is the reference every ratio is taken against
    ceilings: Mapping[str, CeilingPlan]


# -- scenarios ---------------------------------------------------------------------------------


class Scenario(ABC):
    """One access pattern from the seed's "Optimum mount settings for common scenarios"."""

    #: the name used with --scenario
    name: ClassVar[str]
    #: the scenario's number in issue #9 (1-5 follow the seed's order)
    number: ClassVar[int]
    title: ClassVar[str]
    #: DATASET_MOUNT_* settings for the mount, as the seed recommends for this scenario
    mount_env: ClassVar[Mapping[str, str]] = {}
    #: where the settings come from, and anything a reader of the results should know
    settings_note: ClassVar[str] = ""
    #: diagnostic mounts: system name -> settings applied on top of `mount_env`
    mount_variants: ClassVar[Mapping[str, Mapping[str, str]]] = {}
    #: mounts whose readers hint their order: system name -> hint window (files ahead) and
    #: settings applied on top of `mount_env` (a diagnostic mount when there are any)
    hinted_variants: ClassVar[Mapping[str, tuple[int, Mapping[str, str]]]] = {}
    #: for a scenario with phases: also run blobmount and rclone-full as `<name>-kept`, whose
    #: kernel caches are dropped only before the run, not between phases (as in a training job)
    kept_cache_variants: ClassVar[bool] = False
    #: set for a slot that is not built yet: why, and what it waits for
    todo: ClassVar[str | None] = None

    @abstractmethod
    def workload(self, datasets: Datasets, profile: Profile) -> Workload:
        """Build the plans (uploading the datasets it needs on first use)."""

    @abstractmethod
    def systems(self, workload: Workload) -> list[System]:
        """What runs this scenario, in report order (ceilings first). A scenario read through
        mounts subclasses `scenarios.lineup.MountScenario`, which runs the default lineup."""


class PendingScenario(Scenario):
    """A TODO slot: listed and reported, never run."""

    def workload(self, datasets: Datasets, profile: Profile) -> Workload:
        raise NotImplementedError(f"scenario {self.name} is a TODO slot: {self.todo}")

    def systems(self, workload: Workload) -> list[System]:
        return []  # never asked: a TODO slot has no workload


# -- systems -----------------------------------------------------------------------------------


class System(ABC):
    """Something a scenario's workload can be run on."""

    name: str
    kind: str
    description: str

    def applies_to(self, workload: Workload) -> bool:
        return True

    @abstractmethod
    def run_once(self, bench: Bench, scenario: Scenario, workload: Workload) -> RunMetrics:
        """One timed, verified run."""

    def settings(self, scenario: Scenario) -> dict[str, str]:
        return {}

    def describe(self, workload: Workload) -> str:
        return self.description


def timeout_for(workload: Workload, bench: Bench) -> float:
    """A generous bound on one run: a stalled mount must not stall the whole benchmark."""
    if bench.run_timeout_s is not None:
        return bench.run_timeout_s
    return max(120.0, workload.requested_bytes / 10e6 + workload.files / 25)


# -- the run's shared state --------------------------------------------------------------------


@dataclass
class Bench:
    """What every system needs: the datasets, where to put files, options."""

    datasets: Datasets
    profile: Profile
    out_dir: Path
    repeat: int = 1
    py_spy: bool = False
    #: a fixed limit per run instead of `timeout_for(workload, bench)`
    run_timeout_s: float | None = None
    #: write once to the memory a run will take, just before it (guest_memory.py)
    prefault: bool = True
    #: "dropped", or why the kernel caches could not be dropped (filled in by the first run)
    cache_drop: str = ""
    #: the next run's prefault: bytes to write, and what was done (see prepare_memory)
    prefault_bytes: int = 0
    last_prefault: Prefault | None = None

    def arm_prefault(self, nbytes: int) -> None:
        """The next run writes once to `nbytes` of free memory just before its timer starts."""
        self.prefault_bytes = nbytes if self.prefault else 0
        self.last_prefault = None

    def prepare_memory(self) -> None:
        """Called by the meter right before a run's timed part (once per run): after the
        mount is up, so that the memory is still backed by the host when the run takes it."""
        if self.prefault_bytes and self.last_prefault is None:
            self.last_prefault = prefault_free_memory(self.prefault_bytes)
