"""A loopback port whose connects hang: a listener that never accepts, its accept queue filled,
so the kernel drops further SYNs (the connect-timeout tests of the HTTP client and the
storage client)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def blackhole_port(fillers: int = 8) -> Iterator[int]:
    """The port, valid inside the block; `fillers` connects fill the queue of a listen(0)."""
    listener = socket.socket()
    sockets = [listener]
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(fillers):
            filler = socket.socket()
            sockets.append(filler)
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
        yield port
    finally:
        for sock in sockets:
            sock.close()
