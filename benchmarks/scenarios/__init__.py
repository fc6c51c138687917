"""Benchmark scenarios, and the harness pieces they share.

A scenario module defines a `Scenario` subclass and registers an instance with `register()` at
import time; `discover()` imports every module of this package, so adding a scenario is adding a
file. Modules that register nothing are the harness itself; their imports point one way, from
`plans` at the bottom through `base` and the systems to `lineup` (benchmarks/README.md, Layout).

Numbers follow issue #9: 1-5 are the seed's "Optimum mount settings for common scenarios" in its
order, 6 is listing and 7 is download mode; 8 is the small files behind a throttle (issue #27).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scenarios.base import Scenario

_REGISTRY: dict[str, Scenario] = {}


def register(scenario: Scenario) -> Scenario:
    """Make `scenario` runnable by name. Names must be unique."""
    if scenario.name in _REGISTRY:
        raise ValueError(f"two scenarios are named {scenario.name!r}")
    _REGISTRY[scenario.name] = scenario
    return scenario


def discover() -> list[Scenario]:
    """Every registered scenario (TODO slots included), in issue #9's order."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return sorted(_REGISTRY.values(), key=lambda s: (s.number, s.name))
