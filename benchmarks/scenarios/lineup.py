"""Which systems run a scenario read through mounts, in report order: the top of the harness's
systems (it names them all). A scenario of another kind lists its own (download.py, listing.py).
"""

from __future__ import annotations

from typing import ClassVar

from scenarios.base import Scenario, System, Workload
from scenarios.blobmount_system import BlobmountSystem
from scenarios.ceiling import CeilingSystem
from scenarios.rclone import RcloneSystem

#: rclone's two ends: no data cache at all, and every byte read kept on local disk
RCLONE_CACHE_MODES = ("off", "full")


def default_systems(scenario: Scenario, workload: Workload) -> list[System]:
    """Ceilings first (reference, then diagnostics), then the mount, its variants, then rclone."""
    kept = scenario.kept_cache_variants
    whole = isinstance(scenario, MountScenario) and scenario.whole_file_rows
    readers = scenario.reader_rows if isinstance(scenario, MountScenario) else ()
    return [
        *(CeilingSystem(name) for name in workload.ceilings),
        BlobmountSystem(),
        *([BlobmountSystem(whole_file=True)] if whole else []),
        *(
            BlobmountSystem(whole_file=w, readers=n)
            for n in readers
            for w in ((False, True) if whole else (False,))
        ),
        *(BlobmountSystem(name, env) for name, env in scenario.mount_variants.items()),
        *(
            BlobmountSystem(name, env, hint_window=w)
            for name, (w, env) in scenario.hinted_variants.items()
        ),
        *([BlobmountSystem(keep_kernel_caches=True)] if kept else []),
        *([BlobmountSystem(keep_kernel_caches=True, whole_file=True)] if kept and whole else []),
        *(RcloneSystem(mode) for mode in RCLONE_CACHE_MODES),
        # the peer at the same few readers (issue #25 compares them with rclone's cache-off mount)
        *(RcloneSystem("off", readers=n) for n in readers),
        *([RcloneSystem("full", keep_kernel_caches=True)] if kept else []),
    ]


class MountScenario(Scenario):
    """A scenario read through mounts: its ceilings, blobmount and its variants, and the rclone
    mounts (`default_systems`)."""

    #: also run blobmount in whole-file mode (`blobmount-whole-file`, and `-kept` with the
    #: scenario's kept-cache variants)
    whole_file_rows: ClassVar[bool] = False
    #: also run blobmount with these numbers of reader threads (`blobmount-<n>r`, and
    #: `blobmount-whole-file-<n>r` when `whole_file_rows`)
    reader_rows: ClassVar[tuple[int, ...]] = ()

    def systems(self, workload: Workload) -> list[System]:
        return default_systems(self, workload)
