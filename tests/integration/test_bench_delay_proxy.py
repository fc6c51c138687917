"""The benchmark's delay proxy (benchmarks/scenarios/delay_proxy.py): every response comes back
late by the delay, byte for byte, and the proxy's process ends when stopped."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import trio
from scenarios.datasets import Store
from scenarios.delay_proxy import DelayProxy

from blobmount.storage.azure import AzureStorageClient
from blobmount.testing.azurite import AzuriteServer
from blobmount.testing.pattern import pattern_bytes

DELAY_MS = 50.0


class _Upstream:
    """Answers each line "<n>" with n pattern bytes; "close" makes it hang up."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                if line.strip() == b"close":
                    return
                conn.sendall(pattern_bytes("proxy-test", 0, int(line)))


@pytest.fixture
def delayed() -> Iterator[tuple[DelayProxy, _Upstream]]:
    upstream = _Upstream()
    proxy = DelayProxy(upstream.port, DELAY_MS).start()
    try:
        yield proxy, upstream
    finally:
        proxy.stop()
        upstream.sock.close()


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = conn.recv(min(1 << 20, n - got))
        assert chunk, f"connection closed after {got} of {n} bytes"
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def test_each_response_is_late_by_the_delay_and_intact(delayed):
    proxy, _ = delayed
    with socket.create_connection(("127.0.0.1", proxy.port)) as conn:
        for size in (100, 25_000, 8 << 20):  # keep-alive: one connection, several answers
            started = time.monotonic()
            conn.sendall(f"{size}\n".encode())
            first = conn.recv(1)
            late = time.monotonic() - started
            rest = _read_exactly(conn, size - 1)
            assert first + rest == pattern_bytes("proxy-test", 0, size)
            assert late >= DELAY_MS / 1000 * 0.95


def test_a_closed_upstream_closes_the_client_after_its_bytes(delayed):
    proxy, _ = delayed
    with socket.create_connection(("127.0.0.1", proxy.port)) as conn:
        conn.sendall(b"1000\nclose\n")
        assert _read_exactly(conn, 1000) == pattern_bytes("proxy-test", 0, 1000)
        conn.settimeout(5)
        assert conn.recv(1) == b""


def test_stop_ends_the_process():
    upstream = _Upstream()
    proxy = DelayProxy(upstream.port, 1).start()
    pid = proxy.pid
    proxy.stop()
    upstream.sock.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_store_behind_the_proxy_serves_azurite_bytes(azurite: AzuriteServer, container: str):
    data = pattern_bytes("proxy-blob", 0, 3 << 20)
    azurite.upload(container, "blob.bin", data)
    proxy = DelayProxy(azurite.port, 5).start()
    try:
        store = Store(azurite, container, proxy)
        assert f":{proxy.port}/" in store.account_url
        assert set(store.backend_pids()) == {"azurite", "proxy"}

        async def fetch() -> bytes:
            client = AzureStorageClient(store.account_url, container, azurite.credential())
            try:
                props = await client.get_properties("blob.bin")
                return await client.get_range("blob.bin", props.etag, 0, props.size)
            finally:
                await client.aclose()

        assert trio.run(fetch) == data
    finally:
        proxy.stop()
