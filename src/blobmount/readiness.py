"""Telling whoever started the daemon that the mount is ready, failed, or is stopping.

Two channels, both optional: a pipe from `blobmount mount` (background mode) named by
BLOBMOUNT_READY_FD, and systemd's NOTIFY_SOCKET (Type=notify units).
"""

from __future__ import annotations

import logging
import os
import select
import socket
import subprocess
import time

log = logging.getLogger(__name__)

READY_FD_ENV = "BLOBMOUNT_READY_FD"


class ReadyNotifier:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        fd = env.get(READY_FD_ENV)
        self._fd = int(fd) if fd and fd.isdigit() else None
        self._notify_socket = env.get("NOTIFY_SOCKET")
        self.state = "starting"

    def _pipe(self, line: str) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, (line.replace("\n", " ") + "\n").encode())
            os.close(self._fd)
        except OSError:
            pass  # the parent gave up waiting; nothing to tell
        self._fd = None

    def _systemd(self, message: str) -> None:
        if not self._notify_socket:
            return
        address = self._notify_socket
        if address.startswith("@"):
            address = "\0" + address[1:]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(message.encode(), address)
        except OSError as exc:
            log.warning("could not notify systemd: %s", exc)

    def ready(self, status: str) -> None:
        self.state = "ready"
        self._pipe("ready " + status)
        self._systemd(f"READY=1\nSTATUS={status}")

    def error(self, message: str) -> None:
        self.state = "failed"
        self._pipe("error " + message)
        self._systemd(f"STATUS=failed: {message}")

    def stopping(self) -> None:
        self.state = "stopping"
        self._systemd("STOPPING=1\nSTATUS=unmounting")


def wait_for_ready_line(read_fd: int, child: subprocess.Popen[bytes], timeout_s: float) -> str:
    """The line a daemon started with READY_FD_ENV=<write end> sends ("ready ..." or
    "error ..."), or why none came: it exited first, or `timeout_s` passed."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if select.select([read_fd], [], [], min(left, 0.5))[0]:
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break  # the daemon closed the pipe: it is exiting
            data += chunk
    if data:
        return data.decode(errors="replace").strip()
    # after the pipe closed, give the exit a moment to show (bounded by the deadline)
    grace = min(5.0, deadline - time.monotonic())
    try:
        status = child.wait(timeout=grace) if grace > 0 else child.poll()
    except subprocess.TimeoutExpired:
        status = None
    if status is None:
        return f"the mount was not ready after {timeout_s:g}s"
    return f"the daemon exited (status {status}) before the mount was ready"
