"""The daemon's control sockets (stats, hints): Unix sockets in the runtime folder, owner only."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import trio


async def listen_unix(path: Path, backlog: int = 16) -> trio.SocketListener:
    """A listening socket at `path` (mode 0600), replacing a stale one. Remove `path` when done."""
    # a few metadata calls at start and stop: not worth a thread
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.unlink(missing_ok=True)  # noqa: ASYNC240
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(str(path))
    os.chmod(path, 0o600)
    sock.listen(backlog)
    return trio.SocketListener(sock)
