"""Prometheus metrics for a live mount, on an optional HTTP endpoint (DATASET_MOUNT_METRICS_ADDR).

There is no second set of counters: a custom Collector turns the same snapshot that
`blobmount stats` serves into metric families at each scrape, so the two always agree.
prometheus_client serves HTTP from its own thread; the snapshot is taken on the trio thread
(through a trio token), because the components' `statistics()` read state that only the trio
thread may touch while it changes. docs/OPERATIONS.md lists every metric.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias
from wsgiref.simple_server import WSGIServer

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from blobmount.errors import ConfigError
from blobmount.settings import split_host_port

if TYPE_CHECKING:
    from blobmount.blocks.disk_tier import DiskTierStats
    from blobmount.snapshot import MountSnapshot
    from blobmount.wholefile.cache import WholeFileStats

log = logging.getLogger(__name__)

PREFIX = "blobmount"


#: reads one figure of a snapshot; None where its section is off
Figure: TypeAlias = "Callable[[MountSnapshot], float | None]"


def _disk(figure: Callable[[DiskTierStats], float]) -> Figure:
    return lambda s: None if s.disk is None else figure(s.disk)


def _whole(figure: Callable[[WholeFileStats], float]) -> Figure:
    return lambda s: None if s.whole_file is None else figure(s.whole_file)


def _breaker_is(state: str) -> Figure:
    return lambda s: float(s.flow.breaker == state)


# (type, name after "blobmount_", help, figure). A figure of a section that is off is left out,
# which is how the optional disk tier and whole-file mode (None when off) disappear.
SIMPLE: tuple[tuple[str, str, str, Figure], ...] = (
    ("gauge", "uptime_seconds", "Seconds since the mount started", lambda s: s.uptime_s),
    ("gauge", "open_files", "Files open through the mount", lambda s: s.open_files),
    ("gauge", "inodes", "Inodes the kernel currently holds", lambda s: s.inodes),
    (
        "gauge",
        "processes",
        "Processes serving the mount (DATASET_MOUNT_WORKER_PROCESSES)",
        lambda s: len(s.processes) or None,
    ),
    # readers
    (
        "counter",
        "reads",
        "Reads answered (the kernel page cache answers some first)",
        lambda s: s.blocks.reads,
    ),
    ("counter", "read_bytes", "Bytes served to readers", lambda s: s.blocks.bytes_served),
    (
        "gauge",
        "read_throughput_bytes_per_second",
        "Bytes served to readers per second, over the last few seconds",
        lambda s: s.throughput_bytes_per_s,
    ),
    (
        "counter",
        "storage_wait_seconds",
        "Seconds readers spent waiting for blocks to be fetched",
        lambda s: s.blocks.storage_wait_s,
    ),
    # storage
    ("counter", "storage_read_bytes", "Bytes read from storage", lambda s: s.storage.range_bytes),
    (
        "counter",
        "storage_retries",
        "Attempts repeated after a transient failure",
        lambda s: s.retry.retries,
    ),
    (
        "counter",
        "storage_gave_up",
        "Operations that failed after every retry",
        lambda s: s.retry.gave_up,
    ),
    # the account's flow controller and circuit breaker
    (
        "counter",
        "storage_requests_sent",
        "Requests sent to storage, every try of every operation",
        lambda s: s.flow.sent,
    ),
    (
        "counter",
        "storage_throttled",
        "Answers saying storage is over its targets (503, 500, 429)",
        lambda s: s.flow.throttled,
    ),
    (
        "counter",
        "storage_timeouts",
        "Requests with no complete answer in time",
        lambda s: s.flow.timeouts,
    ),
    ("gauge", "storage_in_flight", "Requests to storage in flight", lambda s: s.flow.in_flight),
    (
        "gauge",
        "storage_in_flight_limit",
        "Requests the flow controller allows in flight now (cut when storage pushes back)",
        lambda s: s.flow.in_flight_limit,
    ),
    (
        "gauge",
        "storage_in_flight_limit_max",
        "The most requests the flow controller ever allows in flight",
        lambda s: s.flow.in_flight_limit_max,
    ),
    (
        "counter",
        "storage_limit_cuts",
        "Times the in-flight limit was cut",
        lambda s: s.flow.limit_cuts,
    ),
    (
        "gauge",
        "storage_send_rate",
        "Requests a second the flow controller paces sends at (0: not pacing)",
        lambda s: s.flow.send_rate,
    ),
    (
        "counter",
        "storage_rate_cuts",
        "Times the send rate was cut by a throttle at the in-flight floor",
        lambda s: s.flow.rate_cuts,
    ),
    (
        "counter",
        "storage_queued_seconds",
        "Seconds requests waited for a slot or the account's Retry-After pause",
        lambda s: s.flow.queued_s,
    ),
    (
        "gauge",
        "storage_breaker_open_seconds",
        "How long the circuit breaker has been open (0: closed)",
        lambda s: s.flow.breaker_open_s,
    ),
    (
        "counter",
        "storage_breaker_opened",
        "Times the circuit breaker opened",
        lambda s: s.flow.breaker_opened,
    ),
    (
        "counter",
        "storage_fast_failures",
        "Requests failed at once, unsent, while the circuit breaker was open",
        lambda s: s.flow.fast_failures,
    ),
    (
        "gauge",
        "fetches_in_flight",
        "Block fetches running or queued",
        lambda s: s.blocks.fetcher.in_flight,
    ),
    ("counter", "fetch_failures", "Block fetches that failed", lambda s: s.blocks.fetcher.failed),
    # read-ahead
    (
        "counter",
        "readahead_blocks_fetched",
        "Read-ahead fetches started",
        lambda s: s.blocks.prefetch_started,
    ),
    (
        "counter",
        "readahead_blocks_used",
        "Read-ahead blocks then read",
        lambda s: s.blocks.prefetch_used,
    ),
    (
        "counter",
        "readahead_blocks_wasted",
        "Read-ahead blocks dropped before a reader got to them",
        lambda s: s.blocks.prefetch_wasted,
    ),
    (
        "counter",
        "readahead_skipped",
        "Read-ahead not started because the read-ahead memory limit was reached",
        lambda s: s.blocks.prefetch_skipped_budget,
    ),
    ("gauge", "readahead_bytes", "Bytes held by read-ahead", lambda s: s.blocks.read_ahead_bytes),
    (
        "gauge",
        "readahead_limit_bytes",
        "Read-ahead memory limit",
        lambda s: s.blocks.read_ahead_budget_bytes,
    ),
    # RAM tier
    ("gauge", "ram_cache_bytes", "Bytes in the RAM tier", lambda s: s.blocks.ram.used_bytes),
    ("gauge", "ram_cache_limit_bytes", "RAM tier size", lambda s: s.blocks.ram.capacity_bytes),
    ("gauge", "ram_cache_blocks", "Blocks in the RAM tier", lambda s: s.blocks.ram.entries),
    (
        "counter",
        "ram_cache_evictions",
        "Blocks evicted from the RAM tier",
        lambda s: s.blocks.ram.evictions,
    ),
    # disk tier
    ("counter", "disk_cache_hits", "Blocks found in the disk tier", _disk(lambda d: d.hits)),
    (
        "counter",
        "disk_cache_misses",
        "Blocks looked for in the disk tier, not found",
        _disk(lambda d: d.misses),
    ),
    (
        "counter",
        "disk_cache_corrupt",
        "Disk tier files that failed verification",
        _disk(lambda d: d.corrupt),
    ),
    (
        "counter",
        "disk_cache_slow_inline_reads",
        "Times small disk tier reads on the event loop were slow (reads then move to threads)",
        _disk(lambda d: d.inline.slow_reads),
    ),
    ("gauge", "disk_cache_bytes", "Bytes in the disk tier", _disk(lambda d: d.space.used_bytes)),
    ("gauge", "disk_cache_limit_bytes", "Disk tier size", _disk(lambda d: d.space.capacity_bytes)),
    ("gauge", "disk_cache_blocks", "Blocks in the disk tier", _disk(lambda d: d.space.entries)),
    (
        "gauge",
        "disk_write_queue_bytes",
        "Bytes waiting to be written to the disk tier",
        _disk(lambda d: d.writer.queued_bytes),
    ),
    (
        "gauge",
        "disk_write_queue_limit_bytes",
        "Disk write queue size",
        _disk(lambda d: d.writer.max_queue_bytes),
    ),
    (
        "counter",
        "disk_blocks_written",
        "Blocks written to the disk tier",
        _disk(lambda d: d.writer.written),
    ),
    # read-order hints
    ("counter", "hints_received", "Read-order hints received", lambda s: s.hints.received),
    (
        "counter",
        "hints_used",
        "Hinted files opened after their fetch started",
        lambda s: s.hints.used,
    ),
    ("counter", "hints_late", "Hints the reader overtook", lambda s: s.hints.late),
    (
        "counter",
        "hints_wasted",
        "Files fetched for hints and never opened",
        lambda s: s.hints.wasted,
    ),
    (
        "gauge",
        "hints_ahead_files",
        "Hinted files fetched ahead, not opened yet",
        lambda s: s.hints.ahead,
    ),
    (
        "gauge",
        "hinted_bytes",
        "Bytes of hinted blocks held for their readers",
        lambda s: s.blocks.hinted.held_bytes,
    ),
    (
        "counter",
        "hinted_dropped_bytes",
        "Bytes fetched for hints and never read",
        lambda s: s.blocks.hinted.dropped_bytes,
    ),
    # whole-file mode
    (
        "counter",
        "whole_file_read_bytes",
        "Bytes served to readers from whole-file copies",
        _whole(lambda w: w.served_bytes),
    ),
    (
        "counter",
        "whole_file_downloads",
        "Files downloaded into the whole-file cache",
        _whole(lambda w: w.downloads),
    ),
    (
        "counter",
        "whole_file_downloaded_bytes",
        "Bytes downloaded into the whole-file cache",
        _whole(lambda w: w.downloaded_bytes),
    ),
    (
        "counter",
        "whole_file_cached_opens",
        "Opens served by a file already in the whole-file cache",
        _whole(lambda w: w.cached_opens),
    ),
    (
        "counter",
        "whole_file_fallbacks",
        "Opens streamed in block mode because the file does not fit in the cache",
        _whole(lambda w: w.fallbacks),
    ),
    (
        "counter",
        "whole_file_failed_downloads",
        "Whole-file downloads that failed (the open got EIO)",
        _whole(lambda w: w.failed_downloads),
    ),
    (
        "gauge",
        "whole_file_cache_bytes",
        "Bytes in the whole-file cache",
        _whole(lambda w: w.space.used_bytes),
    ),
    (
        "gauge",
        "whole_file_cache_limit_bytes",
        "Whole-file cache size",
        _whole(lambda w: w.space.capacity_bytes),
    ),
)

# (type, name, help, label, {label value: figure})
LABELLED: tuple[tuple[str, str, str, str, dict[str, Figure]], ...] = (
    (
        "counter",
        "block_lookups",
        "Blocks readers needed, by where they were found: the open file's buffer, the RAM "
        "tier, or a fetch (disk tier or storage) that the reader waited for",
        "source",
        {
            "buffer": lambda s: s.blocks.buffer_hits,
            "ram": lambda s: s.blocks.ram_hits,
            "fetch": lambda s: s.blocks.storage_waits,
        },
    ),
    (
        "counter",
        "storage_requests",
        "Storage operations by kind (a retried operation counts once)",
        "operation",
        {
            "range": lambda s: s.storage.range_requests,
            "list": lambda s: s.storage.list_requests,
            "properties": lambda s: s.storage.properties_requests,
        },
    ),
    (
        "gauge",
        "storage_breaker_state",
        "The circuit breaker's state: 1 for the current one",
        "state",
        {state: _breaker_is(state) for state in ("closed", "open", "half-open")},
    ),
    (
        "counter",
        "disk_blocks_not_written",
        "Blocks not written to the disk tier, by reason",
        "reason",
        {
            "queue_full": _disk(lambda d: d.writer.dropped_queue_full),
            "no_space": _disk(lambda d: d.writer.dropped_no_space),
            "failed": _disk(lambda d: d.writer.failed),
        },
    ),
)


def metric_names() -> list[str]:
    """Every metric this module can export, as a scrape shows it (counters end in _total)."""
    names = [f"{PREFIX}_mount_info", f"{PREFIX}_storage_errors_total"]
    for kind, name, *_ in (*SIMPLE, *LABELLED):
        names.append(f"{PREFIX}_{name}" + ("_total" if kind == "counter" else ""))
    return names


def _family(
    kind: str, name: str, doc: str, labels: list[str]
) -> CounterMetricFamily | GaugeMetricFamily:
    family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    return family_type(f"{PREFIX}_{name}", doc, labels=labels)


def metric_families(s: MountSnapshot) -> list[Metric]:
    """The metric families for one `blobmount stats` snapshot (pure; see docs/OPERATIONS.md)."""
    out: list[Metric] = []
    info = _family(
        "gauge", "mount_info", "The source (no secrets) and mount point", ["source", "mountpoint"]
    )
    info.add_metric([s.source, s.mountpoint], 1.0)
    out.append(info)
    for kind, name, doc, figure in SIMPLE:
        value = figure(s)
        if value is not None:
            family = _family(kind, name, doc, [])
            family.add_metric([], float(value))
            out.append(family)
    for kind, name, doc, label, figures in LABELLED:
        samples = [(key, v) for key, figure in figures.items() if (v := figure(s)) is not None]
        if samples:
            family = _family(kind, name, doc, [label])
            for key, value in samples:
                family.add_metric([key], float(value))
            out.append(family)
    family = _family(
        "counter",
        "storage_errors",
        "Storage operations that failed after retries, by kind",
        ["kind"],
    )
    for kind, count in sorted(s.storage.errors.items()):
        family.add_metric([kind], float(count))
    out.append(family)
    return out


class SnapshotCollector(Collector):
    """Collects from `snapshot()` at each scrape; yields nothing while there is no snapshot to
    take yet (the port is bound before the mount exists) or any more (unmounting)."""

    def __init__(self, snapshot: Callable[[], MountSnapshot] | None = None) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot
        if snapshot is None:
            return
        try:
            s = snapshot()
        except trio.RunFinishedError:
            return  # the mount is gone
        yield from metric_families(s)


@dataclass(slots=True)
class MetricsServer:
    """A running /metrics endpoint; `publish` gives it the snapshot function."""

    server: WSGIServer
    thread: threading.Thread
    collector: SnapshotCollector

    @property
    def url(self) -> str:
        address = self.server.server_address
        host, port = str(address[0]), int(address[1])
        return f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"

    def publish(
        self, snapshot: Callable[[], MountSnapshot], trio_token: trio.lowlevel.TrioToken | None
    ) -> None:
        """Serve `snapshot()` from now on. With `trio_token`, each scrape runs it on that trio
        loop's thread (it must run there); without, on the HTTP thread."""
        if trio_token is None:
            self.collector.snapshot = snapshot
            return
        token = trio_token

        def on_trio_thread() -> MountSnapshot:
            return trio.from_thread.run_sync(snapshot, trio_token=token)

        self.collector.snapshot = on_trio_thread

    def close(self) -> None:
        """Stop serving and free the port (waits at most about half a second)."""
        self.collector.snapshot = None
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_metrics_server(host: str, port: int) -> MetricsServer:
    """Listen on host:port and serve /metrics from a thread; nothing of the mount's until
    `publish`, only the process's own metrics.

    Raises:
        OSError: the address cannot be listened on (in use, not local, not resolvable).
    """
    collector = SnapshotCollector()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    # RSS, CPU time and open descriptors of the daemon, from /proc: what the settings bound
    ProcessCollector(registry=registry)
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(server, thread, collector)


@asynccontextmanager
async def open_metrics(address: str | None) -> AsyncIterator[Metrics]:
    """The endpoint at DATASET_MOUNT_METRICS_ADDR's "host:port" (None: off), bound on entry
    so that a port in use stops the mount before anything is mounted; closed on exit.

    Raises:
        ConfigError: nothing can listen at `address`; the message names the variable.
    """
    if address is None:
        yield Metrics(None)
        return
    try:
        host, port = split_host_port(address)
        server = start_metrics_server(host, port)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(
            f"DATASET_MOUNT_METRICS_ADDR={address!r}: cannot serve metrics there: {reason}"
        ) from None
    log.info("metrics at %s", server.url)
    try:
        yield Metrics(server)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(server.close)


@dataclass(slots=True)
class Metrics:
    """What `open_metrics` yields: the server, or None when metrics are off."""

    server: MetricsServer | None

    def publish(self, snapshot: Callable[[], MountSnapshot]) -> None:
        """Serve `snapshot()` (called on the current trio thread) from now on."""
        if self.server is not None:
            self.server.publish(snapshot, trio.lowlevel.current_trio_token())
