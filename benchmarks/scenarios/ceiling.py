"""The ceiling: a scenario's `CeilingPlan` done directly with `AzureStorageClient` (the client
the mount uses) on trio, into memory, no FUSE. "ceiling" is the reference every ratio is taken
against; other ceiling plans are diagnostics. `run.py` also warms Azurite up with a few GETs of
a ceiling plan."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence

from scenarios.base import Bench, Scenario, System, Workload, timeout_for
from scenarios.datasets import Store
from scenarios.measure import ResourceMeter, drop_kernel_caches
from scenarios.plans import CeilingPlan, RangeGet, phase_items
from scenarios.results import PhasedRun, RunMetrics
from scenarios.verify import listing_mismatch, verify_gets


class CeilingSystem(System):
    """A ceiling plan done directly with AzureStorageClient, as fast as the backend allows."""

    kind = "ceiling"

    def __init__(self, plan_name: str) -> None:
        self.name = plan_name
        self.kind = "ceiling" if plan_name == "ceiling" else "diagnostic"
        self.description = ""

    def applies_to(self, workload: Workload) -> bool:
        return self.name in workload.ceilings

    def describe(self, workload: Workload) -> str:
        return workload.ceilings[self.name].description

    def run_once(self, bench: Bench, scenario: Scenario, workload: Workload) -> RunMetrics:
        plan = workload.ceilings[self.name]
        store = workload.store
        meter = ResourceMeter(
            {"harness": os.getpid(), **store.backend_pids()}, bench.prepare_memory
        )
        timed, pieces = run_ceiling_plan(store, plan, meter, timeout_for(workload, bench))
        usage = meter.usage
        mismatch = timed.listing_mismatch or verify_gets(pieces, workload.source)
        del pieces
        gets = sum(len(step) for step in plan.steps)
        return RunMetrics(
            seconds=timed.seconds,
            verified=mismatch is None,
            client_cpu_s=usage.get("harness"),
            harness_cpu_s=usage.get("harness"),
            azurite_cpu_s=usage.get("azurite"),
            proxy_cpu_s=usage.get("proxy"),
            others_cpu_s=usage.get("others"),
            storage={"range_requests": gets, "range_bytes": workload.requested_bytes},
            mismatch_at=mismatch,
            phases=timed.phases,
        )


def run_ceiling_plan(
    store: Store,
    plan: CeilingPlan,
    meter: ResourceMeter,
    timeout_s: float,
) -> tuple[PhasedRun, list[tuple[RangeGet, bytes]]]:
    """Run `plan` on trio, phase by phase on one client; returns the times and
    [(GET, bytes it returned)].

    The client is created and one request made before the clock starts, as the mount does
    before it is ready (the SDK client and one connection exist; the rest open during the run).
    """
    import trio

    from blobmount.storage.azure import AzureStorageClient

    got: list[tuple[RangeGet, bytes]] = []
    run = PhasedRun()

    async def drain(client: AzureStorageClient, gets: Iterator[RangeGet]) -> None:
        # workers share the iterator: each takes the next GET when its last one is done
        got.extend([(g, await client.get_range(g.blob, g.etag, g.offset, g.length)) for g in gets])

    async def list_all(client: AzureStorageClient) -> set[str]:
        names: set[str] = set()
        token: str | None = None
        while True:
            page = await client.list_page("", delimiter=None, continuation=token)
            names.update(blob.name for blob in page.blobs)
            if (token := page.continuation) is None:
                return names

    async def run_steps(client: AzureStorageClient, steps: Sequence[tuple[RangeGet, ...]]) -> None:
        for step in steps:
            gets = iter(step)
            if len(step) == 1:
                await drain(client, gets)
                continue
            async with trio.open_nursery() as nursery:
                for _ in range(min(plan.concurrency, len(step))):
                    nursery.start_soon(drain, client, gets)

    async def main() -> None:
        # max_connections as the daemon sets it: max(64, 2 * READ_THREADS)
        client = AzureStorageClient(
            store.account_url, store.container, store.az.credential(), max_connections=64
        )
        try:
            await client.get_properties(plan.steps[0][0].blob)
            with trio.fail_after(timeout_s):
                for i, (phase, steps) in enumerate(phase_items(plan.phases, plan.steps)):
                    if i:
                        drop_kernel_caches()  # as between a mount's phases
                    if phase.in_total:
                        meter.start()
                    started = time.perf_counter()
                    if phase.listing is None:
                        await run_steps(client, steps)
                    else:
                        found = await list_all(client)
                        run.listing_mismatch = run.listing_mismatch or listing_mismatch(
                            phase.name, found, phase.listing
                        )
                    run.add(phase, time.perf_counter() - started, bool(plan.phases))
                    if phase.in_total:
                        meter.stop()
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()

    trio.run(main)
    return run, got
