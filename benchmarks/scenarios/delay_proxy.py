"""A TCP proxy on loopback that holds every byte coming back from Azurite for a fixed time.

Azurite on loopback answers in about a millisecond; Azure Blob Storage, seen from a VM in the
same region, takes several to tens of milliseconds to the first byte of a small GET. A reader
that waits for each file in turn (a data loader with a few workers) is bound by that latency,
which a loopback benchmark would never show. Scenarios that are about latency put this proxy
between every system and Azurite (`Datasets.delayed`), so the ceiling, the mounts and rclone all
pay the same delay on every request.

Model: each chunk the upstream sends is passed on `delay_ms` after it arrived, in order, so
every response starts `delay_ms` late and then streams at full speed (a one-way delay on the
response path; requests pass at once). Connections are proxied one to one, so keep-alive works
on both sides. Flow control: while a client is not taking its bytes, its upstream is not read.

The proxy runs as a process of its own (``python delay_proxy.py --upstream-port P --delay-ms D``,
printing ``port N`` once it listens), so its CPU is not taken from the harness' readers and is
metered apart ("proxy" in the run's CPU figures). It needs nothing but the standard library.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: tests.helpers is under the repository's root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.helpers.proxy_process import ProxyProcess

HOST = "127.0.0.1"


# -- the proxy (runs in its own process) ----------------------------------------------------


class _Upstream(asyncio.Protocol):
    """The proxy's connection to Azurite: what it sends goes to the client, delayed."""

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.client.send_later(data)

    def connection_lost(self, exc: Exception | None) -> None:
        # Azurite closed (its EOF closes this transport too): close the client, after what
        # came before it
        self.client.send_later(b"")


class _Client(asyncio.Protocol):
    """One client connection: requests go upstream at once, responses come back late."""

    def __init__(self, upstream_port: int, delay_s: float) -> None:
        self.upstream_port = upstream_port
        self.delay_s = delay_s
        self.transport: asyncio.Transport | None = None
        self.upstream: _Upstream | None = None
        self.early: list[bytes] = []  # request bytes received before upstream connected
        #: (when to send, bytes); b"" closes the connection
        self.due: collections.deque[tuple[float, bytes]] = collections.deque()
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(
                lambda: _Upstream(self), HOST, self.upstream_port
            )
        except OSError:
            self._close()
            return
        self.upstream = upstream
        assert upstream.transport is not None
        for data in self.early:
            upstream.transport.write(data)
        self.early.clear()
        if self.closed:
            upstream.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.upstream is None or self.upstream.transport is None:
            self.early.append(data)
        else:
            self.upstream.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()

    # flow control: the client's socket buffer is full, so stop reading Azurite's answer
    def pause_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()

    def send_later(self, data: bytes) -> None:
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        self.due.append((loop.time() + self.delay_s, data))
        if self.timer is None:
            self.timer = loop.call_at(self.due[0][0], self._send_due)

    def _send_due(self) -> None:
        self.timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self.due and self.due[0][0] <= now:
            _, data = self.due.popleft()
            if not data:
                self._close()
                return
            assert self.transport is not None
            self.transport.write(data)
        if self.due:
            self.timer = loop.call_at(self.due[0][0], self._send_due)

    def _close(self) -> None:
        self.due.clear()
        if self.transport is not None:
            self.transport.close()


async def serve(upstream_port: int, delay_ms: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Client(upstream_port, delay_ms / 1000), HOST, 0, backlog=1024
    )
    port = server.sockets[0].getsockname()[1]
    print(f"port {port}", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, required=True)
    args = parser.parse_args(argv)
    if args.delay_ms < 0:
        parser.error("--delay-ms must not be negative")
    asyncio.run(serve(args.upstream_port, args.delay_ms))
    return 0


# -- the harness' handle on it --------------------------------------------------------------


class DelayProxy(ProxyProcess):
    """A running delay proxy in front of `upstream_port`; `stop()` ends it (by its PID)."""

    what = "delay proxy"

    def __init__(self, upstream_port: int, delay_ms: float) -> None:
        super().__init__()
        self.upstream_port = upstream_port
        self.delay_ms = delay_ms

    def _command(self) -> list[str]:
        return [
            str(Path(__file__).resolve()),
            "--upstream-port",
            str(self.upstream_port),
            "--delay-ms",
            str(self.delay_ms),
        ]


if __name__ == "__main__":
    sys.exit(main())
