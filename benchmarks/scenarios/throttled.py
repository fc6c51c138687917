"""Scenario 8: the small files read once behind a throttle (issue #27's benchmark).

A storage account over its request-rate target answers 503 ServerBusy and expects its clients to
send less. Here a proxy admits `PER_SECOND` requests a second and answers 503 to the rest
(scenarios/throttle_proxy.py), and the small files are read once through it:

- `ceiling`: one GET per file, 32 at once, with `AzureStorageClient` and per-request retries
  (the mount's retry layer alone: every GET backs off on its own, no shared limit);
- `blobmount`: 16 reader threads through a mount, whose requests share the account's flow
  controller (an adaptive in-flight limit, an account-wide Retry-After, a circuit breaker);
- `blobmount-no-flow-control` (diagnostic): the same mount with DATASET_MOUNT_FLOW_CONTROL=false.

The throttle bounds every system at `PER_SECOND` files/s, so the interesting figures are how
close each gets to it and what it costs the account: the requests sent per file read (the
proxy's counts, refused ones included). The mounts retry a request up to their default
AZUREML_DATASET_HTTP_RETRY_COUNT (7) times; the ceiling up to `CEILING_RETRIES` times: with 7,
32 GETs each backing off on its own gave up on a file in a run here (8 refusals in a row), and a
ceiling that fails has no time to compare with.
"""

from __future__ import annotations

from typing import ClassVar

from scenarios import register
from scenarios.base import System, Workload
from scenarios.datasets import Datasets
from scenarios.plans import Profile
from scenarios.small_files import LATENCY_MS, SmallFiles
from scenarios.throttled_systems import Throttle, ThrottledBlobmount, ThrottledCeiling

#: requests a second the proxy admits; the rest get a 503 at once
PER_SECOND = 200
#: the ceiling's per-request retries: enough that no GET gives up (the mount keeps its 7)
CEILING_RETRIES = 20
NO_FLOW_CONTROL = {"DATASET_MOUNT_FLOW_CONTROL": "false"}


class Throttled(SmallFiles):
    name = "throttled"
    number = 8
    title = (
        f"Many small files (~25 KB), each read once by 16 threads, through a throttle of "
        f"{PER_SECOND} requests/s (503 ServerBusy beyond)"
    )
    settings_note = (
        "seed: disk cache off, memory cache 0 (block cache on); flow control on (default); "
        f"every system behind its own fresh proxy admitting {PER_SECOND} requests/s; "
        "blobmount-no-flow-control: DATASET_MOUNT_FLOW_CONTROL=false"
    )
    whole_file_rows = False
    reader_rows: ClassVar[tuple[int, ...]] = ()

    def workload(self, datasets: Datasets, profile: Profile) -> Workload:
        small = datasets.small()
        # the store stays Azurite's own: each run puts a throttle in front of it, and run.py's
        # untimed warm-up GETs do not count against anyone's rate
        return self.read_each_once(small, small.store, len(small.names))

    throttle: ClassVar[Throttle] = Throttle(PER_SECOND)

    def systems(self, workload: Workload) -> list[System]:
        return [
            ThrottledCeiling(self.throttle, CEILING_RETRIES),
            ThrottledBlobmount(self.throttle),
            ThrottledBlobmount(self.throttle, "blobmount-no-flow-control", NO_FLOW_CONTROL),
        ]


class ThrottledLatency(Throttled):
    """The same throttle when every answer takes as long as it does from a VM in the account's
    region (a delay proxy in front of the throttle delays every answer, 503s included, by
    `LATENCY_MS`): a request's latency decides how many in flight make the throttle's rate."""

    name = "throttled-latency"
    title = Throttled.title + f", every answer {LATENCY_MS:g} ms late"
    settings_note = Throttled.settings_note + (
        f"; a delay proxy in front of the throttle delays every answer by {LATENCY_MS:g} ms"
    )
    throttle: ClassVar[Throttle] = Throttle(PER_SECOND, delay_ms=LATENCY_MS)


register(Throttled())
register(ThrottledLatency())
