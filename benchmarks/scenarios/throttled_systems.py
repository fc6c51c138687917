"""The systems of scenario `throttled`: the ceiling client and blobmount, each run behind a fresh
throttle proxy (scenarios/throttle_proxy.py) that admits a fixed number of requests per second
and answers 503 ServerBusy beyond it.

Every run starts its own proxy, so each system meets the same throttle from the same state, and
the proxy's counts of that run are the requests the system sent, refused ones included. They
replace the run's `storage` request counters (so the report's "storage requests" column shows
every request sent, not one per file read), with `sent_requests` and `refused_requests` beside
them in the JSON, and the requests sent per file read in the run's log line.

- `ThrottledCeiling`: the scenario's ceiling plan with `AzureStorageClient` (the client the mount
  uses) under the mount's own per-request retry layer (`RetryingStorageClient`: full-jitter
  exponential backoff, a Retry-After honoured) and nothing else: every GET retries on its own,
  as a client without flow control does.
- `ThrottledBlobmount`: `blobmount mount`, with its flow controller (or, as a diagnostic,
  without it: DATASET_MOUNT_FLOW_CONTROL=false).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from scenarios.base import Bench, Scenario, System, Workload, timeout_for
from scenarios.blobmount_system import BlobmountSystem
from scenarios.datasets import Store
from scenarios.delay_proxy import DelayProxy
from scenarios.measure import ResourceMeter
from scenarios.mounted import MountedDaemon
from scenarios.plans import CeilingPlan, RangeGet
from scenarios.results import RunMetrics
from scenarios.throttle_proxy import ThrottleProxy
from scenarios.verify import verify_gets

log = logging.getLogger(__name__)

#: the proxy's request kinds, by the name of the run's counter the report shows
_KIND_KEYS = {
    "range": "range_requests",
    "properties": "properties_requests",
    "list": "list_requests",
}
Counts = dict[str, dict[str, int]]


@dataclass(frozen=True, slots=True)
class Throttle:
    """The throttle every system of the scenario meets."""

    per_second: int
    #: the Retry-After of its 503s (None: none, so a client must find the rate by itself)
    retry_after: str | None = None
    #: every answer, 503s included, this late (a delay proxy in front of the throttle)
    delay_ms: float = 0.0

    def note(self) -> str:
        after = f"Retry-After {self.retry_after} s" if self.retry_after else "no Retry-After"
        late = f"; every answer delayed {self.delay_ms:g} ms" if self.delay_ms else ""
        return f"through a proxy admitting {self.per_second} requests/s (503 beyond, {after}){late}"


@dataclass(frozen=True, slots=True)
class ThrottledStore(Store):
    """A store reached through a running throttle proxy."""

    throttle: ThrottleProxy | None = None
    #: a delay proxy in front of the throttle, when answers are to come late
    delay: DelayProxy | None = None

    @property
    def account_url(self) -> str:
        front = self.delay or self.throttle
        assert front is not None
        return f"http://127.0.0.1:{front.port}/{self.az.account}"

    def backend_pids(self) -> dict[str, int]:
        assert self.throttle is not None
        pids = {"azurite": self.az.pid, "proxy": self.throttle.pid}
        if self.delay is not None:
            pids["delay proxy"] = self.delay.pid
        return pids


@contextlib.contextmanager
def behind(throttle: Throttle, workload: Workload) -> Iterator[tuple[ThrottleProxy, Workload]]:
    """A fresh throttle proxy in front of the workload's Azurite (and a delay proxy in front of
    it, with `delay_ms`), and the workload through them; stopped on the way out."""
    az = workload.store.az
    with contextlib.ExitStack() as stack:
        proxy = stack.enter_context(
            ThrottleProxy(az.port, throttle.per_second, throttle.retry_after)
        )
        delay = None
        if throttle.delay_ms:
            delay = DelayProxy(proxy.port, throttle.delay_ms)
            stack.callback(delay.stop)
            delay.start()
        store = ThrottledStore(az, workload.store.container, throttle=proxy, delay=delay)
        yield proxy, dataclasses.replace(workload, store=store)


def sent_between(before: Counts, after: Counts) -> dict[str, int]:
    """The run's request counters from two snapshots of the proxy's counts."""
    out = dict.fromkeys(_KIND_KEYS.values(), 0)
    out["sent_requests"] = out["refused_requests"] = 0
    for kind, now in after.items():
        was = before.get(kind, {})
        sent = now.get("requests", 0) - was.get("requests", 0)
        out["sent_requests"] += sent
        out["refused_requests"] += now.get("busy", 0) - was.get("busy", 0)
        if kind in _KIND_KEYS:
            out[_KIND_KEYS[kind]] = sent
    return out


def log_requests(system: str, files: int, seconds: float, storage: Mapping[str, int]) -> None:
    sent = storage["sent_requests"]
    log.info(
        "%s behind the throttle: %d files in %.2f s (%.0f files/s); %d requests sent, %.2f per "
        "file read, %d refused",
        system,
        files,
        seconds,
        files / seconds if seconds else 0.0,
        sent,
        sent / files if files else 0.0,
        storage["refused_requests"],
    )


# -- the ceiling -------------------------------------------------------------------------------


class ThrottledCeiling(System):
    """The ceiling plan with AzureStorageClient and per-request retries, behind the throttle."""

    name = "ceiling"
    kind = "ceiling"

    def __init__(self, throttle: Throttle, retries: int) -> None:
        self.throttle = throttle
        self.retries = retries
        self.description = ""

    def applies_to(self, workload: Workload) -> bool:
        return self.name in workload.ceilings

    def describe(self, workload: Workload) -> str:
        return (
            f"{workload.ceilings[self.name].description}, each GET retried on its own "
            f"(RetryingStorageClient, {self.retries} retries, full-jitter backoff), "
            f"{self.throttle.note()}"
        )

    def run_once(self, bench: Bench, scenario: Scenario, workload: Workload) -> RunMetrics:
        plan = workload.ceilings[self.name]
        with behind(self.throttle, workload) as (proxy, throttled):
            store = throttled.store
            meter = ResourceMeter(
                {"harness": os.getpid(), **store.backend_pids()}, bench.prepare_memory
            )
            timed = _fetch(store, plan, proxy, meter, self.retries, timeout_for(workload, bench))
        seconds, pieces, before, after = timed
        mismatch = verify_gets(pieces, workload.source)
        del pieces
        storage = sent_between(before, after)
        storage["range_bytes"] = workload.requested_bytes
        log_requests(self.name, workload.files, seconds, storage)
        usage = meter.usage
        return RunMetrics(
            seconds=seconds,
            verified=mismatch is None,
            client_cpu_s=usage.get("harness"),
            harness_cpu_s=usage.get("harness"),
            azurite_cpu_s=usage.get("azurite"),
            proxy_cpu_s=usage.get("proxy"),
            others_cpu_s=usage.get("others"),
            storage=storage,
            mismatch_at=mismatch,
        )


def _fetch(
    store: Store,
    plan: CeilingPlan,
    proxy: ThrottleProxy,
    meter: ResourceMeter,
    retries: int,
    timeout_s: float,
) -> tuple[float, list[tuple[RangeGet, bytes]], Counts, Counts]:
    """Run `plan` with a retrying client on trio; returns its seconds, [(GET, bytes)], and the
    proxy's counts when the clock started and when it stopped. As in scenarios/ceiling.py, the
    client is made and one request answered before the clock starts."""
    import trio

    from blobmount.storage.azure import AzureStorageClient
    from blobmount.storage.retry import RetryingStorageClient

    got: list[tuple[RangeGet, bytes]] = []
    counts: list[Counts] = []
    took: list[float] = []

    async def drain(client: RetryingStorageClient, gets: Iterator[RangeGet]) -> None:
        # workers share the iterator: each takes the next GET when its last one is done
        got.extend([(g, await client.get_range(g.blob, g.etag, g.offset, g.length)) for g in gets])

    async def main() -> None:
        # max_connections as the daemon sets it: max(64, 2 * READ_THREADS)
        azure = AzureStorageClient(
            store.account_url, store.container, store.az.credential(), max_connections=64
        )
        client = RetryingStorageClient(azure, retries=retries)
        try:
            await client.get_properties(plan.steps[0][0].blob)
            counts.append(proxy.counts())
            meter.start()
            started = time.perf_counter()
            with trio.fail_after(timeout_s):
                for step in plan.steps:
                    gets = iter(step)
                    async with trio.open_nursery() as nursery:
                        for _ in range(min(plan.concurrency, len(step))):
                            nursery.start_soon(drain, client, gets)
            took.append(time.perf_counter() - started)
            meter.stop()
            counts.append(proxy.counts())
            stats = client.statistics()
            log.info("ceiling: %d retries, %d GETs given up", stats.retries, stats.gave_up)
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()

    trio.run(main)
    return took[0], got, counts[0], counts[1]


# -- the mount ---------------------------------------------------------------------------------


class ThrottledBlobmount(BlobmountSystem):
    """`blobmount mount` behind the throttle; the proxy's counts are read when the harness reads
    the daemon's (after the mount is up and before the clock starts, and after the run)."""

    def __init__(
        self,
        throttle: Throttle,
        name: str = "blobmount",
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(name, extra_env)
        self.throttle = throttle
        self.description += f"; {throttle.note()}"
        self._proxy: ThrottleProxy | None = None
        self._counts: list[Counts] = []

    def stats(self, daemon: MountedDaemon) -> dict[str, Any] | None:
        stats = super().stats(daemon)
        if self._proxy is not None:
            self._counts.append(self._proxy.counts())
        return stats

    def run_once(self, bench: Bench, scenario: Scenario, workload: Workload) -> RunMetrics:
        with behind(self.throttle, workload) as (proxy, throttled):
            self._proxy, self._counts = proxy, []
            try:
                run = super().run_once(bench, scenario, throttled)
            finally:
                self._proxy = None
        if len(self._counts) < 2:
            raise RuntimeError("the throttle proxy's counts were not read before and after")
        storage = sent_between(self._counts[0], self._counts[-1])
        if "range_bytes" in run.storage:
            storage["range_bytes"] = run.storage["range_bytes"]
        run.storage = storage
        log_requests(self.name, workload.files, run.seconds, storage)
        flow = (run.stats_after or {}).get("flow")
        if flow:
            log.info(
                "%s: in-flight limit %d of %d at the end, cut %d times; send rate cut %d times"
                " (%.0f/s at the end, 0: off); %d throttled answers",
                self.name,
                flow["in_flight_limit"],
                flow["in_flight_limit_max"],
                flow["limit_cuts"],
                flow.get("rate_cuts", 0),
                flow.get("send_rate", 0.0),
                flow["throttled"],
            )
        return run
