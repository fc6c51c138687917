"""TODO slots of issue #9: scenarios that wait for features being built now.

Each is listed by `run.py --list` and reported as TODO; none runs. Replace a slot with a real
`Scenario` in its own module when its feature lands (and delete it here).
"""

from __future__ import annotations

from scenarios import register
from scenarios.base import PendingScenario


class MultiEpoch(PendingScenario):
    name = "multi-epoch"
    number = 4
    title = "Many small files read over several epochs (25% random sample per epoch)"
    mount_env = {"DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "true"}
    settings_note = "seed: block cache on, other settings default (disk cache on)"
    todo = (
        "needs the disk tier (blocks/disk_tier.py, being built): later epochs are served from "
        "the disk cache; report first epoch, last epoch and total, as the seed's table does"
    )


class Download(PendingScenario):
    name = "download"
    number = 7
    title = "Download mode: the whole dataset copied to local disk"
    todo = (
        "download mode has its own benchmark for now (benchmarks/download_bench.py: ceiling, "
        "download, local-only); fold it in here as a Scenario with a download System"
    )


register(MultiEpoch())
register(Download())
