"""`blobmount mount --foreground` as a system: the mount under test, with a scenario's settings
and, for a diagnostic variant, extra settings, read-order hints or the kernel's caches kept
between phases; in block mode or in whole-file mode, read by the scenario's reader threads or
by a number of its own. Its counters come from `blobmount stats --json`."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scenarios.base import FOREIGN_ENV, KEPT_NOTE, KEPT_SUFFIX, Scenario
from scenarios.datasets import Store
from scenarios.mount_system import MountSystem
from scenarios.mounted import MountedDaemon
from scenarios.readers import HintSource

log = logging.getLogger(__name__)

#: a `src` folder to run the daemon from instead of this checkout's (the harness stays this
#: checkout's): `BLOBMOUNT_BENCH_DAEMON_SRC=/old/src benchmarks/run.py ...` measures old code
DAEMON_SRC_ENV = "BLOBMOUNT_BENCH_DAEMON_SRC"
#: the setting that picks whole-file mode (block mode is its default, true)
WHOLE_FILE_ENV = {"DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "false"}
#: a whole-file system is named with this suffix, a system with its own reader count with -<n>r
WHOLE_FILE_SUFFIX = "-whole-file"


class BlobmountSystem(MountSystem):
    """`blobmount mount --foreground`, fresh, with the scenario's seed-recommended settings
    (and, for a diagnostic variant, `extra_env` on top).

    `whole_file` mounts in whole-file mode (the scenario's settings, and
    DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=false); `readers` runs the scenario's mount plan
    with that many reader threads instead of its own number (a DataLoader worker reads with one).
    """

    def __init__(
        self,
        name: str = "blobmount",
        extra_env: Mapping[str, str] | None = None,
        hint_window: int = 0,
        keep_kernel_caches: bool = False,
        *,
        whole_file: bool = False,
        readers: int | None = None,
    ) -> None:
        name += WHOLE_FILE_SUFFIX if whole_file else ""
        name += f"-{readers}r" if readers else ""
        self.name = f"{name}{KEPT_SUFFIX}" if keep_kernel_caches else name
        self.keeps_kernel_caches = keep_kernel_caches
        self.extra_env = dict(extra_env or {})
        self.whole_file = whole_file
        self.readers = readers
        self.hint_window = hint_window
        self.kind = "diagnostic" if extra_env else "mount"
        mode = (
            "whole-file mode, DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=false"
            if whole_file
            else ("block mode")
        )
        self.description = f"blobmount mount ({mode}), fresh daemon and cache dir"
        if extra_env:
            changed = " ".join(f"{k}={v}" for k, v in self.extra_env.items())
            self.description = f"diagnostic: {self.description}, with {changed}"
        if keep_kernel_caches:
            self.description += KEPT_NOTE
        if hint_window:
            self.description += (
                f"; the readers' order hinted {hint_window} files ahead "
                "(blobmount.hints.client.hinted)"
            )

    def hints(self, daemon: MountedDaemon) -> HintSource | None:
        return HintSource(self.hint_window, daemon.env) if self.hint_window else None

    def settings(self, scenario: Scenario) -> dict[str, str]:
        mode = WHOLE_FILE_ENV if self.whole_file else {}
        return {**scenario.mount_env, **mode, **self.extra_env}

    def _env(self, store: Store, scenario: Scenario, work: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN_ENV)}
        env.update(self.settings(scenario))
        env["AZURE_STORAGE_CONNECTION_STRING"] = store.connection_string
        env["DATASET_MOUNT_CACHE_DIR"] = str(work / "cache")
        # a private runtime dir: the stats socket and mount record of this daemon only
        env["XDG_RUNTIME_DIR"] = str(work / "run")
        daemon_src = os.environ.get(DAEMON_SRC_ENV)
        if daemon_src:
            env["PYTHONPATH"] = daemon_src
        env["XDG_STATE_HOME"] = str(work / "state")
        return env

    def daemon(self, store: Store, scenario: Scenario, work: Path) -> MountedDaemon:
        uri = store.uri
        cmd = [
            sys.executable,
            "-m",
            "blobmount",
            "mount",
            "--foreground",
            "--log-file",
            str(work / "daemon.log"),
            uri,
            str(work / "mnt"),
        ]
        return MountedDaemon(cmd, self._env(store, scenario, work), work)

    def stats(self, daemon: MountedDaemon) -> dict[str, Any] | None:
        done = subprocess.run(
            [sys.executable, "-m", "blobmount", "stats", str(daemon.mountpoint), "--json"],
            env=daemon.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            log.warning("blobmount stats failed: %s", done.stderr.strip())
            return None
        stats: dict[str, Any] = json.loads(done.stdout)
        return stats
