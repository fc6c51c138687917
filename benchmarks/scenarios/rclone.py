"""rclone mount as the established peer (issue #9): `rclone-off` and `rclone-full`.

The Debian package (rclone 1.60, `make bench-deps`). The remote is defined only by environment
variables (`RCLONE_CONFIG_BENCH_*`) and `RCLONE_CONFIG` points at a file in the run's own temp
dir that does not exist, so no global rclone config is read or written; HOME and the XDG dirs
point there too, so nothing lands in the caller's home.

rclone 1.60's azureblob backend builds `https://<account>.<endpoint>` from an account and an
endpoint, so it cannot reach a path-style Azurite on a free port (`use_emulator` is fixed to
port 10000). A container SAS URL (read + list) takes any URL, so the remote is
`sas_url = http://127.0.0.1:<port>/<account>/<container>?<sas>`; it is passed in the
environment, never on the command line (`ps` would show it).

Fetched bytes come from rclone's remote control (`--rc` on a free loopback port, no auth:
`core/stats` `bytes`), so "fetched / requested" is comparable with blobmount's; rclone does not
count requests.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
import urllib.request
from pathlib import Path
from typing import Any

from scenarios.base import FOREIGN_ENV, KEPT_NOTE, KEPT_SUFFIX, Scenario
from scenarios.datasets import Store
from scenarios.mount_system import MountSystem
from scenarios.mounted import MountedDaemon

log = logging.getLogger(__name__)

REMOTE = "bench"
#: how long the SAS stays valid (read + list only: a read-only mount needs nothing else)
SAS_HOURS = 12


def _container_sas_url(store: Store) -> str:
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    az = store.az
    sas = generate_container_sas(
        az.account,
        store.container,
        account_key=az.account_key,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=SAS_HOURS),
    )
    return f"{store.account_url}/{store.container}?{sas}"


class RcloneSystem(MountSystem):
    """`rclone mount` of the store's container, read-only, fresh cache dir, with
    `--vfs-cache-mode <mode>`; every other option is rclone's default, as a user would run it."""

    def __init__(
        self, cache_mode: str, keep_kernel_caches: bool = False, readers: int | None = None
    ) -> None:
        name = f"rclone-{cache_mode}" + (f"-{readers}r" if readers else "")
        self.name = f"{name}{KEPT_SUFFIX if keep_kernel_caches else ''}"
        self.readers = readers
        self.keeps_kernel_caches = keep_kernel_caches
        self.cache_mode = cache_mode
        self.kind = "peer"
        #: the remote-control port of the daemon started last (runs are one at a time)
        self.rc_port = 0
        self.description = (
            f"rclone mount (Debian rclone), --vfs-cache-mode {cache_mode}, fresh daemon and "
            "cache dir, other options default"
        ) + (KEPT_NOTE if keep_kernel_caches else "")

    def settings(self, scenario: Scenario) -> dict[str, str]:
        return {"--vfs-cache-mode": self.cache_mode, "--read-only": ""}

    def daemon(self, store: Store, scenario: Scenario, work: Path) -> MountedDaemon:
        exe = shutil.which("rclone")
        if exe is None:
            raise FileNotFoundError("rclone is not installed: run `make bench-deps`")
        from blobmount.testing.azurite import free_port

        env = {k: v for k, v in os.environ.items() if not k.startswith((*FOREIGN_ENV, "RCLONE_"))}
        env.update(
            {
                "RCLONE_CONFIG": str(work / "rclone.conf"),  # absent: defaults + the env remote
                f"RCLONE_CONFIG_{REMOTE.upper()}_TYPE": "azureblob",
                f"RCLONE_CONFIG_{REMOTE.upper()}_SAS_URL": _container_sas_url(store),
                "HOME": str(work),
                "XDG_CACHE_HOME": str(work / "xdg-cache"),
                "XDG_CONFIG_HOME": str(work / "xdg-config"),
            }
        )
        self.rc_port = free_port()
        cmd = [
            exe,
            "mount",
            f"{REMOTE}:{store.container}",
            str(work / "mnt"),
            "--read-only",
            "--vfs-cache-mode",
            self.cache_mode,
            "--cache-dir",
            str(work / "cache"),
            "--rc",
            "--rc-addr",
            f"127.0.0.1:{self.rc_port}",
            "--rc-no-auth",
            "--log-file",
            str(work / "daemon.log"),
            "--log-level",
            "INFO",
        ]
        return MountedDaemon(cmd, env, work)

    def stats(self, daemon: MountedDaemon) -> dict[str, Any] | None:
        """rclone's `core/stats`, with its byte count as `storage.range_bytes`."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.rc_port}/core/stats",
            data=b"{}",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                stats: dict[str, Any] = json.load(response)
        except OSError as exc:
            log.warning("rclone core/stats failed: %s", exc)
            return None
        stats["storage"] = {"range_bytes": int(stats.get("bytes", 0))}
        return stats
