"""Live statistics of a mount: served as JSON on a Unix socket in the runtime folder (never
inside the mounted namespace), read back as a typed `MountSnapshot`, and formatted for humans.

The JSON never contains secrets: only counters, sizes and the source's display form.
"""

from __future__ import annotations

import collections
import json
import logging
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from blobmount.blocks.disk_tier import DiskTierStats
from blobmount.blocks.hinted import HintedBlockStats
from blobmount.hints.coordinator import HintStats
from blobmount.process_figures import ProcessFigures
from blobmount.snapshot import MountSnapshot
from blobmount.storage.flow import FlowStats
from blobmount.units import format_size
from blobmount.unixsock import listen_unix
from blobmount.wholefile.cache import WholeFileStats

log = logging.getLogger(__name__)


class ThroughputMeter:
    """Bytes per second over the last few seconds, from a counter sampled once a second."""

    def __init__(self, read_total: Callable[[], int], window_s: int = 5) -> None:
        self._read_total = read_total
        self._samples: collections.deque[tuple[float, int]] = collections.deque(maxlen=window_s + 1)

    def sample(self) -> None:
        self._samples.append((time.monotonic(), self._read_total()))

    def bytes_per_s(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


async def serve_stats(
    path: Path,
    snapshot: Callable[[], MountSnapshot],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Answer every connection on `path` with one JSON snapshot. Runs until cancelled.

    Started with `nursery.start`, it returns only once the socket is listening, so a `stats`
    call made as soon as the mount answers is never refused."""
    listener = await listen_unix(path)
    task_status.started()

    async def answer(stream: trio.SocketStream) -> None:
        async with stream:
            try:
                await stream.send_all(
                    json.dumps(snapshot().to_json(), default=str).encode() + b"\n"
                )
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    try:
        await trio.serve_listeners(answer, [listener])
    finally:
        path.unlink(missing_ok=True)  # noqa: ASYNC240


def fetch_stats(path: Path, timeout_s: float = 5.0) -> dict[str, Any]:
    """Read one snapshot from a mount's stats socket as the JSON the daemon sent (blocking). Tests
    that check the wire form use it; everything else reads `fetch_snapshot`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(path))
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    data: dict[str, Any] = json.loads(b"".join(chunks))
    return data


def fetch_snapshot(path: Path, timeout_s: float = 5.0) -> MountSnapshot:
    """Read one snapshot from a mount's stats socket (blocking; for the CLI, warm and the API).

    Raises:
        OSError: nothing answers on `path`.
        SnapshotFormatError: the answer lacks a figure (a different blobmount version).
    """
    return MountSnapshot.from_json(fetch_stats(path, timeout_s))


def _ratio(hits: int, total: int) -> str:
    return f"{hits / total:.1%}" if total else "-"


def format_stats(s: MountSnapshot) -> str:
    """A human-readable summary of a snapshot."""
    st, blocks, retry = s.storage, s.blocks, s.retry
    ram, fetcher = blocks.ram, blocks.fetcher
    block_lookups = blocks.buffer_hits + blocks.ram_hits + blocks.storage_waits
    memory_hits = blocks.buffer_hits + blocks.ram_hits
    errors = ", ".join(f"{k} {v}" for k, v in sorted(st.errors.items())) or "none"
    lines = [
        f"source            {s.source}",
        f"mount point       {s.mountpoint} (pid {s.pid}, up {s.uptime_s:.0f}s)",
        f"served to readers {format_size(blocks.bytes_served)} in {blocks.reads} reads, "
        f"now {format_size(int(s.throughput_bytes_per_s))}/s",
        f"storage requests  {st.range_requests} range ({format_size(st.range_bytes)}), "
        f"{st.list_requests} list, {st.properties_requests} properties",
        f"retries / errors  {retry.retries} retries, {retry.gave_up} gave up; errors: {errors}",
        _flow_line(s.flow),
        f"cache hits        RAM {_ratio(memory_hits, block_lookups)} of {block_lookups} blocks "
        f"(buffer {blocks.buffer_hits}, RAM tier {blocks.ram_hits}); "
        f"disk {_disk_ratio(s.disk)}",
        f"read-ahead        {blocks.prefetch_started} fetched, {blocks.prefetch_used} used, "
        f"{blocks.prefetch_wasted} wasted; holding {format_size(blocks.read_ahead_bytes)}"
        f" of {format_size(blocks.read_ahead_budget_bytes)}",
        f"RAM tier          {format_size(ram.used_bytes)} of "
        f"{format_size(ram.capacity_bytes)} ({ram.entries} blocks)",
        _disk_line(s.disk),
        *_whole_file_lines(s.whole_file),
        *_hint_lines(s.hints, blocks.hinted),
        f"waiting on storage {blocks.storage_waits} reads, "
        f"{blocks.storage_wait_s:.2f}s total; {fetcher.in_flight} fetches in flight",
        f"open files        {s.open_files}, inodes {s.inodes}",
        *_process_lines(s.processes),
    ]
    return "\n".join(lines)


def _process_lines(processes: Sequence[ProcessFigures]) -> list[str]:
    """Each process's share of the requests and its CPU: how evenly the kernel spreads them."""
    if not processes:
        return []  # an older daemon
    total = sum(p.requests for p in processes)
    each = "; ".join(
        f"pid {p.pid}{' (main)' if p.main else ''} {_ratio(p.requests, total)}, {p.cpu_s:.1f}s CPU"
        for p in processes
    )
    held = sum(p.shared_lock_s for p in processes)
    return [
        f"processes         {len(processes)}, {total} requests: {each}; "
        f"shared locks held {held:.3f}s"
    ]


def _flow_line(flow: FlowStats) -> str:
    breaker = flow.breaker
    if flow.breaker_open_s > 0:
        breaker += f" for {flow.breaker_open_s:.0f}s"
    return (
        f"flow control      {flow.in_flight} in flight, limit {flow.in_flight_limit} of "
        f"{flow.in_flight_limit_max} ({flow.limit_cuts} cuts); {_pacing(flow)}{flow.sent} sent, "
        f"{flow.throttled} throttled ({flow.refusals_retried} retried on credit), "
        f"{flow.timeouts} timed out, queued {flow.queued_s:.1f}s; "
        f"breaker {breaker} (opened {flow.breaker_opened}x, {flow.fast_failures} failed at once)"
    )


def _pacing(flow: FlowStats) -> str:
    if not flow.send_rate and not flow.rate_cuts:
        return ""
    return f"pacing {flow.send_rate:.0f}/s ({flow.rate_cuts} cuts); "


def _disk_ratio(disk: DiskTierStats | None) -> str:
    # blocks the RAM tier missed, looked for on disk: how many were there
    if disk is None:
        return "off"
    lookups = disk.hits + disk.misses
    return f"{_ratio(disk.hits, lookups)} of {lookups} blocks"


def _disk_line(disk: DiskTierStats | None) -> str:
    if disk is None:
        return "disk tier         off"
    space, writer = disk.space, disk.writer
    dropped = writer.dropped_queue_full + writer.dropped_no_space + writer.failed
    return (
        f"disk tier         {format_size(space.used_bytes)} of "
        f"{format_size(space.capacity_bytes)} ({space.entries} blocks), {disk.hits} hits, "
        f"{disk.corrupt} corrupt; queue {format_size(writer.queued_bytes)}, "
        f"{writer.written} written, {dropped} not written"
    )


def _whole_file_lines(whole: WholeFileStats | None) -> list[str]:
    if whole is None:
        return []  # block mode
    space = whole.space
    return [
        f"whole-file cache  {format_size(space.used_bytes)} of "
        f"{format_size(space.capacity_bytes)} ({space.entries} files), "
        f"{whole.open_copies} open; opens: {whole.cached_opens} cached, "
        f"{whole.shared_opens} shared, {whole.downloads} downloaded "
        f"({format_size(whole.downloaded_bytes)}), {whole.fallbacks} streamed, "
        f"{whole.failed_downloads} failed, {whole.corrupt} corrupt"
    ]


def _hint_lines(hints: HintStats, store: HintedBlockStats) -> list[str]:
    if not hints.received:
        return []  # no job has sent hints
    return [
        f"hints             {hints.received} received, {hints.used} used, "
        f"{hints.late} late, {hints.wasted} wasted, {hints.invalid} invalid; "
        f"{hints.ahead} files ahead, {hints.queued} queued, {hints.streams} streams"
        f"; holding {format_size(store.held_bytes)} of {format_size(store.limit_bytes)}"
    ]
