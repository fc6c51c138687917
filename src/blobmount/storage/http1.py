"""HTTP/1.1 on trio for the Azure storage client: kept-alive connections to one endpoint.

Why not aiohttp through the asyncio bridge: the storage client's calls are the daemon's most
frequent work (one GET per small file), and a GET through the bridge cost 0.74-1.0 ms of client
CPU against 0.27-0.35 ms here (2,000 GETs of 25 KB against Azurite, one and 16 at a time,
docs/developer-notes/storage-client.md): the two thread hops, the second event loop and the GIL
handed back and forth between them cost more than the request. httpx, the maintained client that
runs on trio, cost 1.6-1.8 ms. So requests go out from the trio task that makes them, and the
parts are the maintained ones: httptools (llhttp) parses each answer's head and chunked bodies,
`ssl` and `trio.SSLStream` do TLS, `urllib.request` reads the proxy variables, `multidict` holds
the headers.

What it does, and no more (the storage client sends only GET and HEAD, and parses what comes
back): one `Http1Client` per storage endpoint, a pool of at most `max_connections` connections
(a request waits for one), each reused while the server keeps it alive. A connection that was
idle is checked before it is reused (the server may have closed it), and a request that finds
it closed before any byte of the answer is sent again once on a new connection (GET and HEAD
are idempotent); a connection idle for over `KEEPALIVE_S` is not reused. A body is read to its
Content-Length (or its last chunk) straight from the socket, so the caller can cut it into
parts as it arrives; an answer not read to its end closes its connection, as does a cancelled
request. Timeouts are per step, as aiohttp's were: connecting (with TLS and any proxy tunnel)
within the connect timeout, every read within the read timeout; the caller sets the deadline
of the whole call.

Errors are the standard library's: `ConnectionRefusedError`, `socket.gaierror`, `TimeoutError`,
`ssl.SSLError` under a `ConnectionError`, and `ConnectionError` subclasses of this module for a
body cut short (`BodyCut`), an answer that is not HTTP (`ProtocolError`) and a proxy that failed
(`ProxyError`). Their texts name host and port at most, never a URL (a SAS travels in the query).

Proxies: `HTTP_PROXY` for http:// endpoints (the request line then names the whole URL),
`HTTPS_PROXY` for https:// ones (a CONNECT tunnel, TLS end to end inside it), either in lower
case too, and `NO_PROXY`, read when the client is made. A proxy URL may carry a user and
password (sent as Basic `Proxy-Authorization`).
"""

from __future__ import annotations

import base64
import socket
import ssl
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import unquote, urlsplit

import httptools
import trio
from multidict import CIMultiDict, CIMultiDictProxy

#: a connection idle this long is closed rather than reused (aiohttp's default keep-alive);
#: a silent network path (a NAT that forgot it) would otherwise cost a read timeout
KEEPALIVE_S = 15.0
#: the longest answer head accepted
MAX_HEAD_BYTES = 64 * 1024
#: the most read from the socket at once (a small file's answer comes in one read)
RECEIVE_BYTES = 256 * 1024
#: a body read without waiting lets other tasks run after this many bytes
YIELD_BYTES = 1024 * 1024
#: NO_PROXY matching as urllib does it (hosts, domain suffixes, "*"; not in typeshed)
_bypass: Callable[[str, dict[str, str]], bool] = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
#: statuses whose answers have no body whatever their headers say
_NO_BODY_STATUSES = frozenset({204, 304})


class ProtocolError(ConnectionError):
    """The server's answer is not HTTP/1.1 we can read."""


class BodyCut(ConnectionError):
    """The connection ended before the body its headers announced was all there."""


class ProxyError(ConnectionError):
    """The proxy could not be reached, or refused to open a tunnel to the endpoint."""

    def __init__(self, message: str, host: str, port: int) -> None:
        super().__init__(message)
        #: the proxy's address, for `compose.diagnosis`
        self.host = host
        self.port = port


# -- where connections go ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Route:
    """How a request reaches the endpoint: directly, or through an HTTP proxy."""

    #: where the TCP connection goes (the endpoint, or the proxy)
    host: str
    port: int
    #: through a proxy for an http:// endpoint: the request line names the whole URL
    absolute_form: bool = False
    #: through a proxy for an https:// endpoint: CONNECT first, then TLS inside the tunnel
    tunnel: bool = False
    #: the proxy's `Proxy-Authorization` value, when its URL carries a user
    proxy_authorization: str | None = None


def route_for(scheme: str, host: str, port: int, env: Mapping[str, str]) -> Route:
    """The route to `host:port` that the proxy variables in `env` ask for (README, "Proxies")."""
    proxies = _proxies(env)
    proxy = proxies.get(scheme)
    if not proxy or _bypass(host, proxies):
        return Route(host, port)
    if "://" not in proxy:
        proxy = f"http://{proxy}"
    parts = urlsplit(proxy)
    proxy_host, proxy_port = parts.hostname or "", parts.port or 80
    if parts.scheme != "http" or not proxy_host:
        # never the URL itself: it may carry a password
        raise ProxyError(
            f"the {scheme} proxy must be given as http://host:port", proxy_host, proxy_port
        )
    authorization = None
    if parts.username is not None:
        login = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(login.encode()).decode("ascii")
    return Route(
        proxy_host,
        proxy_port,
        absolute_form=scheme == "http",
        tunnel=scheme == "https",
        proxy_authorization=authorization,
    )


def _proxies(env: Mapping[str, str]) -> dict[str, str]:
    """The proxy variables of `env` as `urllib.request` reads them (lower case wins)."""
    found: dict[str, str] = {}
    for name, value in env.items():
        lower = name.lower()
        if value and lower.endswith("_proxy"):
            key = lower[: -len("_proxy")]
            if key not in found or name == lower:
                found[key] = value
    return found


# -- one connection ---------------------------------------------------------------------------


class _Head:
    """httptools' callbacks for an answer's head (and a chunked body's pieces)."""

    __slots__ = ("complete", "fields", "pieces")

    def __init__(self) -> None:
        self.fields: list[tuple[str, str]] = []
        self.pieces: list[bytes] = []
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class _Connection:
    __slots__ = ("idle_since", "raw", "socket", "stream", "tls", "used")

    def __init__(
        self, stream: trio.abc.Stream, sock: trio.socket.SocketType, raw: socket.socket
    ) -> None:
        self.stream = stream
        #: the TCP socket under it (TLS or not), closed through trio ...
        self.socket = sock
        #: ... and the same socket as the standard library's, to look at it and, without TLS,
        #: to read and write it without a pass through trio's scheduler
        self.raw = raw
        self.tls = False
        self.used = False
        self.idle_since = 0.0

    def looks_reusable(self, now: float) -> bool:
        """Idle not too long, and nothing waiting to be read: a server that closed it (or sent
        anything unasked) makes it readable."""
        if now - self.idle_since > KEEPALIVE_S:
            return False
        try:
            self.raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False

    async def send_all(self, data: bytes) -> None:
        """Send `data`. Without TLS a request goes out in one `send` when the socket has room
        (it always has, for a request head); trio's stream would also pass its scheduler."""
        if not self.tls:
            try:
                sent = self.raw.send(data)
            except BlockingIOError:
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        try:
            await self.stream.send_all(data)
        except trio.BrokenResourceError as exc:
            raise ConnectionResetError("connection broken while sending") from (
                exc.__cause__ or exc
            )

    async def receive(self, max_bytes: int, timeout_s: float) -> bytes:
        """One read of up to `max_bytes` (b"" at the end of the stream); TimeoutError when none
        comes within `timeout_s`. Without TLS, bytes already waiting are read at once, and only
        an empty socket waits in trio (trio's stream would pass its scheduler on every read)."""
        if not self.tls:
            try:
                return self.raw.recv(max_bytes)
            except BlockingIOError:
                pass
            with trio.move_on_after(timeout_s):
                while True:
                    await trio.lowlevel.wait_readable(self.raw)
                    try:
                        return self.raw.recv(max_bytes)
                    except BlockingIOError:
                        continue
            raise TimeoutError
        with trio.move_on_after(timeout_s):
            try:
                # bytes, from ssl (typed wider by trio.abc.Stream)
                return cast(bytes, await self.stream.receive_some(max_bytes))
            except trio.BrokenResourceError as exc:
                raise ConnectionResetError("connection broken") from (exc.__cause__ or exc)
        raise TimeoutError

    def close(self) -> None:
        self.socket.close()


async def _connect(host: str, port: int) -> _Connection:
    """A TCP connection to the first address of `host` that takes one; the last failure, with
    the host and port on it (for `compose.diagnosis`), when none does."""
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    failure: OSError | None = None
    for family, kind, proto, _, address in infos:
        raw = socket.socket(family, kind, proto)
        sock = trio.socket.from_stdlib_socket(raw)
        try:
            await sock.connect(address)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        except BaseException:
            sock.close()
            raise
        # trio.SocketStream sets TCP_NODELAY: a request is one write, sent at once
        return _Connection(trio.SocketStream(sock), sock, raw)
    if failure is None:
        failure = OSError(f"{host}:{port} has no address")
    failure.host = host  # type: ignore[attr-defined]
    failure.port = port  # type: ignore[attr-defined]
    raise failure


# -- answers ----------------------------------------------------------------------------------


class Answer:
    """An answer whose head has been read. Read its body with `read` or `read_into`, or drop it
    with `release`; either gives the connection back (or closes it)."""

    __slots__ = (
        "_chunked",
        "_client",
        "_conn",
        "_keep_alive",
        "_leftover",
        "_length",
        "_parser",
        "_state",
        "body_bytes",
        "headers",
        "on_done",
        "status",
    )

    def __init__(
        self,
        client: Http1Client,
        conn: _Connection,
        status: int,
        headers: CIMultiDictProxy[str],
        *,
        length: int | None,
        chunked: bool,
        keep_alive: bool,
        leftover: bytes,
        parser: httptools.HttpResponseParser,
        state: _Head,
    ) -> None:
        self._client = client
        self._conn: _Connection | None = conn
        self.status = status
        self.headers = headers
        #: body bytes announced (None: chunked, or until the connection closes)
        self._length = length
        self._chunked = chunked
        self._keep_alive = keep_alive
        self._leftover = leftover
        self._parser = parser
        self._state = state
        #: body bytes read so far
        self.body_bytes = 0
        #: called once the answer is done with (its body read, or released)
        self.on_done: Callable[[Answer], None] | None = None

    async def read(self) -> bytes:
        """The whole body."""
        pieces: list[bytes] = []
        await self.read_into(pieces.append)
        return b"".join(pieces)

    async def read_into(self, feed: Callable[[bytes], None]) -> int:
        """Hand the body to `feed` piece by piece as it arrives; the bytes read. Raises
        `BodyCut` if the connection ends first, TimeoutError if a read waits too long."""
        conn = self._conn
        if conn is None or self._length == 0:
            self.release()
            return self.body_bytes
        try:
            if self._chunked:
                await self._read_chunked(conn, feed)
            else:
                await self._read_to_length(conn, feed)
        except BaseException:
            self.release()
            raise
        self._finish()
        return self.body_bytes

    async def _read_to_length(self, conn: _Connection, feed: Callable[[bytes], None]) -> None:
        length = self._length
        data, self._leftover = self._leftover, b""
        receive = self._client.receive
        unyielded = 0
        while True:
            if data:
                if length is not None and self.body_bytes + len(data) > length:
                    data = data[: length - self.body_bytes]
                    self._keep_alive = False  # more than announced: nothing to trust after
                self.body_bytes += len(data)
                feed(data)
                unyielded += len(data)
            if length is not None and self.body_bytes >= length:
                return
            if unyielded >= YIELD_BYTES:
                # reads that find bytes waiting do not pass the scheduler: let the others run
                unyielded = 0
                await trio.lowlevel.checkpoint()
            want = RECEIVE_BYTES if length is None else min(RECEIVE_BYTES, length - self.body_bytes)
            data = await receive(conn, want)
            if not data:
                if length is None:
                    return  # the body ends with the connection
                raise BodyCut(f"connection closed after {self.body_bytes} of {length} body bytes")

    async def _read_chunked(self, conn: _Connection, feed: Callable[[bytes], None]) -> None:
        state, parser = self._state, self._parser
        data, self._leftover = self._leftover, b""
        while True:
            if data:
                try:
                    parser.feed_data(data)
                except httptools.HttpParserError as exc:
                    raise ProtocolError(f"unreadable chunked body ({type(exc).__name__})") from None
                for piece in state.pieces:
                    self.body_bytes += len(piece)
                    feed(piece)
                state.pieces.clear()
            if state.complete:
                return
            data = await self._client.receive(conn, RECEIVE_BYTES)
            if not data:
                raise BodyCut(f"connection closed after {self.body_bytes} body bytes (chunked)")

    def _finish(self) -> None:
        self._end(reusable=self._keep_alive and not self._leftover)

    def release(self) -> None:
        """Done with the answer: a body not read to its end closes the connection."""
        if self._length is not None and self.body_bytes == self._length and not self._chunked:
            self._finish()  # nothing left unread (a HEAD, an empty body, or all of it)
        else:
            self._end(reusable=False)

    def _end(self, *, reusable: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._client.give_back(conn, reusable=reusable)
        if self.on_done is not None:
            self.on_done(self)

    @property
    def done(self) -> bool:
        """Whether the connection is given back (the body read, or the answer released)."""
        return self._conn is None


# -- the client -------------------------------------------------------------------------------


class Http1Client:
    """Requests to one endpoint (`origin`, "scheme://host[:port]") over kept-alive connections.

    Use from trio only; `aclose` closes the idle connections (answers still held close theirs
    when released).
    """

    def __init__(
        self,
        origin: str,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        max_connections: int,
        env: Mapping[str, str],
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("the endpoint must be an http:// or https:// URL with a host")
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if self.scheme == "https" else 80)
        default_port = self.port == (443 if self.scheme == "https" else 80)
        #: the Host header, and the origin an absolute-form request line starts with
        self.authority = self.host if default_port else f"{self.host}:{self.port}"
        if ":" in self.host:  # an IPv6 literal
            self.authority = f"[{self.host}]" + ("" if default_port else f":{self.port}")
        self._origin = f"{self.scheme}://{self.authority}"
        self.route = route_for(self.scheme, self.host, self.port, env)
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._ssl: ssl.SSLContext | None = None
        if self.scheme == "https":
            self._ssl = ssl_context or ssl.create_default_context()
        self._idle: list[_Connection] = []
        self._slots = trio.Semaphore(max_connections)
        self._closed = False
        #: connections made, and requests sent again after a kept-alive connection was found
        #: closed (tests read them)
        self.connections_made = 0
        self.resent = 0

    # -- connections -----------------------------------------------------------------------

    async def _open(self) -> _Connection:
        route = self.route
        with trio.move_on_after(self.connect_timeout_s) as scope:
            try:
                conn = await _connect(route.host, route.port)
            except OSError as exc:
                if route.host != self.host:
                    raise ProxyError(
                        f"cannot connect to the proxy {route.host}:{route.port} "
                        f"({exc.strerror or type(exc).__name__})",
                        route.host,
                        route.port,
                    ) from exc
                raise
            try:
                if route.tunnel:
                    await self._tunnel(conn.stream)
                if self._ssl is not None:
                    conn.stream = await self._tls(conn.stream)
                    conn.tls = True
            except BaseException:
                conn.close()
                raise
            self.connections_made += 1
            return conn
        assert scope.cancelled_caught
        late = TimeoutError(
            f"connecting to {route.host}:{route.port} took over {self.connect_timeout_s:g}s"
        )
        late.host, late.port = route.host, route.port  # type: ignore[attr-defined]
        raise late

    async def _tls(self, stream: trio.abc.Stream) -> trio.SSLStream[trio.abc.Stream]:
        assert self._ssl is not None
        tls = trio.SSLStream(stream, self._ssl, server_hostname=self.host, https_compatible=True)
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError as exc:
            # the ssl module's error (certificate, protocol) is the cause: keep it in the chain
            raise ConnectionError(f"TLS handshake with {self.host}:{self.port} failed") from (
                exc.__cause__ or exc
            )
        return tls

    async def _tunnel(self, stream: trio.abc.Stream) -> None:
        """Ask the proxy for a tunnel to the endpoint (CONNECT)."""
        route = self.route
        target = f"{self.host}:{self.port}"
        lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
        if route.proxy_authorization:
            lines.append(f"Proxy-Authorization: {route.proxy_authorization}")
        await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = b""
        while b"\r\n\r\n" not in head:
            data = await stream.receive_some(4096)
            if not data or len(head) > MAX_HEAD_BYTES:
                raise ProxyError(
                    f"the proxy {route.host}:{route.port} closed the tunnel to {target}",
                    route.host,
                    route.port,
                )
            head += data
        status_line = head.split(b"\r\n", 1)[0].split(b" ", 2)
        status = status_line[1] if len(status_line) > 1 else b""
        if status != b"200":
            raise ProxyError(
                f"the proxy {route.host}:{route.port} refused a tunnel to {target} "
                f"(HTTP {status.decode('latin-1', 'replace')[:3]})",
                route.host,
                route.port,
            )

    def give_back(self, conn: _Connection, *, reusable: bool) -> None:
        """(Answer) The request on `conn` is over: keep it for the next one, or close it."""
        if reusable and not self._closed:
            conn.used = True
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()
        self._slots.release()

    def _idle_connection(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the least likely to be stale
            if conn.looks_reusable(now):
                return conn
            conn.close()
        return None

    async def receive(self, conn: _Connection, max_bytes: int) -> bytes:
        """One read from `conn`, within the read timeout (TimeoutError past it)."""
        try:
            return await conn.receive(max_bytes, self.read_timeout_s)
        except TimeoutError:
            raise TimeoutError(
                f"no answer from {self.host}:{self.port} in {self.read_timeout_s:g}s"
            ) from None

    # -- requests --------------------------------------------------------------------------

    async def request(self, method: str, target: str, headers: Mapping[str, str]) -> Answer:
        """Send `method target` (`target`: the path and query, percent-encoded) with `headers`;
        the answer with its head read. Release it (or read its body) once done."""
        if self._closed:
            raise ConnectionError("the HTTP client is closed")
        # a request may not wait at all (an idle connection, the answer already there): still
        # a point where a cancelled caller stops, as every trio call is
        await trio.lowlevel.checkpoint_if_cancelled()
        payload = self._encode(method, target, headers)
        await self._slots.acquire()
        try:
            conn = self._idle_connection()
            if conn is not None:
                try:
                    return await self._exchange(conn, method, payload)
                except _Stale:
                    self.resent += 1  # closed by the server while idle: once more, anew
            return await self._exchange(await self._open(), method, payload)
        except BaseException:
            self._slots.release()
            raise

    def _encode(self, method: str, target: str, headers: Mapping[str, str]) -> bytes:
        if self.route.absolute_form:
            target = self._origin + target
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.authority}"]
        if self.route.absolute_form and self.route.proxy_authorization:
            lines.append(f"Proxy-Authorization: {self.route.proxy_authorization}")
        for name, value in headers.items():
            if "\r" in value or "\n" in value:
                raise ValueError(f"header {name} holds a line break")
            lines.append(f"{name}: {value}")
        lines.append("\r\n")
        return "\r\n".join(lines).encode("latin-1")

    async def _exchange(self, conn: _Connection, method: str, payload: bytes) -> Answer:
        """Send the request on `conn` and read the answer's head. A kept-alive connection that
        turns out closed before any byte of the answer raises `_Stale`."""
        try:
            try:
                await conn.send_all(payload)
            except OSError:
                if conn.used:
                    raise _Stale from None
                raise
            return await self._read_head(conn, method)
        except BaseException:
            conn.close()
            raise

    async def _read_head(self, conn: _Connection, method: str) -> Answer:
        buffer = b""
        received = False
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    raise ProtocolError(f"answer head over {MAX_HEAD_BYTES} bytes")
                buffer += await self._receive_head(conn, first=not received)
                received = True
                continue
            state = _Head()
            parser = httptools.HttpResponseParser(state)
            try:
                parser.feed_data(buffer[: end + 4])
            except httptools.HttpParserError as exc:
                raise ProtocolError(f"unreadable answer head ({type(exc).__name__})") from None
            status = parser.get_status_code()
            buffer = buffer[end + 4 :]
            if 100 <= status < 200:
                continue  # an interim answer: the real one follows
            return self._answer(conn, method, status, state, parser, buffer)

    async def _receive_head(self, conn: _Connection, *, first: bool) -> bytes:
        """The next bytes of an answer's head; `_Stale` if a kept-alive connection turns out
        closed before its first byte."""
        stale = first and conn.used
        try:
            data = await self.receive(conn, RECEIVE_BYTES)
        except ConnectionResetError:
            if stale:
                raise _Stale from None
            raise
        if not data:
            if stale:
                raise _Stale
            raise BodyCut(f"{self.host}:{self.port} closed the connection before answering")
        return data

    def _answer(
        self,
        conn: _Connection,
        method: str,
        status: int,
        state: _Head,
        parser: httptools.HttpResponseParser,
        leftover: bytes,
    ) -> Answer:
        headers = CIMultiDictProxy(CIMultiDict(state.fields))
        keep_alive = bool(parser.should_keep_alive())
        chunked = False
        length: int | None
        if method == "HEAD" or status in _NO_BODY_STATUSES:
            length = 0
        elif "chunked" in headers.get("Transfer-Encoding", "").lower():
            chunked, length = True, None
        else:
            declared = headers.get("Content-Length")
            if declared is None:
                length, keep_alive = None, False  # the body ends with the connection
            else:
                try:
                    length = int(declared)
                except ValueError:
                    raise ProtocolError("unreadable Content-Length") from None
                if length < 0:
                    raise ProtocolError("negative Content-Length")
        return Answer(
            self,
            conn,
            status,
            headers,
            length=length,
            chunked=chunked,
            keep_alive=keep_alive,
            leftover=leftover,
            parser=parser,
            state=state,
        )

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _Stale(Exception):
    """A kept-alive connection was closed by the server while idle (send the request anew)."""
