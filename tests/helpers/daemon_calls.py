"""What end-to-end tests ask of a running mount and of the CLI: its stats, a condition waited
for, a `blobmount` command run to completion."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from blobmount.runstate import stats_socket
from blobmount.stats import fetch_stats
from tests.helpers.mount import MountedDaemon

#: how long one CLI command may take before the test fails instead of hanging
CLI_TIMEOUT_S = 120


def stats(daemon: MountedDaemon) -> dict[str, Any]:
    """The daemon's stats, from its stats socket."""
    return fetch_stats(stats_socket(daemon.mountpoint))


def wait_for(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `predicate` until it holds or `timeout_s` passes; whether it held."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def blobmount(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -m blobmount ARGS` to completion, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "blobmount", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
