"""The hint socket: newline-separated paths in, read-order hints for the coordinator.

Protocol (usable from any language: `printf '%s\\n' paths... | socat - UNIX:<socket>`): a client
connects to the mount's hint socket (`blobmount.runstate.hints_socket(mountpoint)`, printed by
`blobmount stats`) and writes one path per line, in the order the job will read them. A path is
either absolute, under the mount point, or relative to the mount root. One connection is one
ordered stream; several clients may be connected at once. Nothing is sent back. Lines that are
not a file of the mount are counted as invalid and skipped; the connection stays open.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import trio

from blobmount.hints.coordinator import HintCoordinator, HintStream
from blobmount.namespace.names import valid_segment
from blobmount.unixsock import listen_unix

log = logging.getLogger(__name__)

#: longer lines are not paths of the mount (PATH_MAX); they are skipped
MAX_LINE = 4096
_RECEIVE = 64 * 1024


def mount_relative(line: bytes, mountpoint: str) -> str | None:
    """The mount-relative path a hint line names, or None if it cannot name a file of the
    mount (outside the mount point, empty, '.'/'..' segments, not UTF-8)."""
    try:
        text = line.decode("utf-8").strip("\r")
    except UnicodeDecodeError:
        return None
    if text.startswith("/"):
        root = mountpoint.rstrip("/") + "/"
        if not text.startswith(root):
            return None
        text = text[len(root) :]
    parts = [p for p in text.split("/") if p]
    if not parts or not all(valid_segment(p) for p in parts):
        return None
    return "/".join(parts)


async def serve_hints(
    path: Path,
    coordinator: HintCoordinator,
    mountpoint: Path,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Take hint streams on `path` until cancelled (started with `nursery.start`)."""
    listener = await listen_unix(path)
    root = os.fspath(mountpoint)
    task_status.started()

    async def take(stream: trio.SocketStream) -> None:
        hints = coordinator.open_stream()
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(coordinator.run_stream, hints)
            try:
                await _receive(stream, hints, coordinator, root)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                coordinator.close_stream(hints)

    try:
        await trio.serve_listeners(take, [listener])
    finally:
        path.unlink(missing_ok=True)  # noqa: ASYNC240


async def _receive(
    stream: trio.SocketStream, hints: HintStream, coordinator: HintCoordinator, root: str
) -> None:
    pending = b""
    skipping = False  # inside a line too long to be a path
    while data := await stream.receive_some(_RECEIVE):
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if skipping:
                skipping = False  # the end of the long line
                continue
            if not line:
                continue
            rel = mount_relative(line, root)
            if rel is None:
                coordinator.invalid()
            else:
                await coordinator.add(hints, rel)
        if len(pending) > MAX_LINE:
            if not skipping:
                coordinator.invalid()
            skipping, pending = True, b""
