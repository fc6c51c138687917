"""Telling whoever started the daemon that the mount is ready, failed, or is stopping.

Two channels, both optional: a pipe from `blobmount mount` (background mode) named by
BLOBMOUNT_READY_FD, and systemd's NOTIFY_SOCKET (Type=notify units).
"""

from __future__ import annotations

import logging
import os
import socket

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
