"""A plain HTTP forward proxy on 127.0.0.1, the kind HTTP_PROXY names, that counts what it
forwards. For tests of which requests a client sends through a proxy.

    with ForwardProxy() as proxy:
        env["HTTP_PROXY"] = proxy.url        # http://127.0.0.1:<port>
        ...
        proxy.requests                        # ["GET http://127.0.0.1:10000/...", ...]

It takes absolute-form requests ("GET http://host:port/path HTTP/1.1"), forwards each to its
origin on a connection of its own with `Connection: close`, and relays the answer until the
origin closes. CONNECT (an HTTPS tunnel) opens a connection to the origin, answers 200 and relays
bytes both ways until either side closes (recorded as "CONNECT host:port"). Only loopback
origins are reached; anything else is answered 403. Requests with a body are answered 501: the
tests need none. `proxy.heads` keeps each request's whole head, to check what a client sent.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from types import TracebackType
from urllib.parse import urlsplit

_HEAD_LIMIT = 64 * 1024


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        head = b""
        while b"\r\n\r\n" not in head and len(head) < _HEAD_LIMIT:
            chunk = self.request.recv(4096)
            if not chunk:
                return
            head += chunk
        request_line, _, rest = head.partition(b"\r\n")
        method, target, version = request_line.decode("latin-1").split(" ", 2)
        with self.server.lock:
            self.server.heads.append(head.split(b"\r\n\r\n", 1)[0].decode("latin-1"))
        if method == "CONNECT":
            self._tunnel(target)
            return
        parts = urlsplit(target)
        if parts.scheme != "http" or b"content-length:" in rest.lower():
            self._answer(501, "Not Implemented")
            return
        if parts.hostname not in ("127.0.0.1", "localhost"):
            self._answer(403, "Forbidden")  # never a hop off this machine
            return
        with self.server.lock:
            self.server.requests.append(f"{method} {target}")
        headers = [
            line
            for line in rest.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
            if line and not line.lower().startswith((b"connection:", b"proxy-", b"keep-alive:"))
        ]
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        upstream_head = b"\r\n".join(
            [f"{method} {path} {version}".encode("latin-1"), *headers, b"Connection: close"]
        )
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=30) as up:
            up.sendall(upstream_head + b"\r\n\r\n")
            while chunk := up.recv(65536):
                self.request.sendall(chunk)

    def _tunnel(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        if host not in ("127.0.0.1", "localhost") or not port.isdigit():
            self._answer(403, "Forbidden")
            return
        with self.server.lock:
            self.server.requests.append(f"CONNECT {target}")
        with socket.create_connection((host, int(port)), timeout=30) as up:
            self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            down = self.request

            def relay(source: socket.socket, sink: socket.socket) -> None:
                with contextlib.suppress(OSError):
                    while chunk := source.recv(65536):
                        sink.sendall(chunk)
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)

            back = threading.Thread(target=relay, args=(up, down), daemon=True)
            back.start()
            relay(down, up)
            back.join(timeout=30)

    def _answer(self, status: int, reason: str) -> None:
        self.request.sendall(
            f"HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
        )


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[str] = []
        self.heads: list[str] = []
        self.lock = threading.Lock()


class ForwardProxy:
    """The proxy, serving on a thread while in use; see the module docstring."""

    def __init__(self) -> None:
        self._server = _Server()
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def requests(self) -> list[str]:
        with self._server.lock:
            return list(self._server.requests)

    @property
    def heads(self) -> list[str]:
        with self._server.lock:
            return list(self._server.heads)

    def __enter__(self) -> ForwardProxy:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        with contextlib.suppress(RuntimeError):
            self._thread.join(timeout=5)
