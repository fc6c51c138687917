"""storage/http1.py against servers on 127.0.0.1 that script each answer: kept-alive
connections and what happens when a server closes one, body framing (length, chunked, until
close, cut short), heads it cannot read, timeouts, cancellation, the connection limit, TLS
(trustme's certificates) and proxies (absolute form, and a CONNECT tunnel through the test
forward proxy)."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

import pytest
import trio
import trustme

from blobmount.storage.http1 import (
    KEEPALIVE_S,
    BodyCut,
    Http1Client,
    ProtocolError,
    ProxyError,
    Route,
    route_for,
)
from tests.helpers.blackhole import blackhole_port
from tests.helpers.forward_proxy import ForwardProxy

#: what a scripted handler gets: the request's head, and the stream to answer on
Handler = Callable[[bytes, trio.abc.Stream], Awaitable[bool]]


def ok(body: bytes, *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@dataclass
class Origin:
    """A server that answers every request with `handler` (True: keep the connection)."""

    handler: Handler
    port: int = 0
    connections: int = 0
    heads: list[bytes] = field(default_factory=list)
    tls: ssl.SSLContext | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def serve(self, tcp: trio.SocketStream) -> None:
        self.connections += 1
        stream: trio.abc.Stream = tcp
        if self.tls is not None:
            stream = trio.SSLStream(tcp, self.tls, server_side=True)
        try:
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                self.heads.append(head)
                if not await self.handler(head, stream):
                    return
        except trio.BrokenResourceError:
            return
        finally:
            await trio.aclose_forcefully(stream)


async def start(nursery: trio.Nursery, handler: Handler, **kwargs: object) -> Origin:
    origin = Origin(handler, **kwargs)  # type: ignore[arg-type]
    listeners = await nursery.start(partial(trio.serve_tcp, origin.serve, 0, host="127.0.0.1"))
    origin.port = listeners[0].socket.getsockname()[1]
    return origin


def answering(*replies: bytes, keep: bool = True) -> Handler:
    """A handler sending `replies` in turn (the last one again after them)."""
    queue = list(replies)

    async def handler(head: bytes, stream: trio.abc.Stream) -> bool:
        reply = queue.pop(0) if len(queue) > 1 else queue[0]
        if head.startswith(b"HEAD "):
            reply = reply[: reply.index(b"\r\n\r\n") + 4]  # HEAD answers carry no body
        await stream.send_all(reply)
        return keep

    return handler


def client(origin: Origin, **kwargs: object) -> Http1Client:
    kwargs.setdefault("connect_timeout_s", 2.0)
    kwargs.setdefault("read_timeout_s", 2.0)
    kwargs.setdefault("max_connections", 4)
    kwargs.setdefault("env", {})
    return Http1Client(origin.url, **kwargs)  # type: ignore[arg-type]


async def get(http: Http1Client, target: str = "/a?sig=SECRET") -> tuple[int, bytes]:
    answer = await http.request("GET", target, {"x-ms-version": "1"})
    return answer.status, await answer.read()


# -- kept-alive connections -------------------------------------------------------------------


async def test_requests_share_one_kept_alive_connection(nursery):
    origin = await start(nursery, answering(ok(b"hello")))
    http = client(origin)
    for _ in range(3):
        assert await get(http) == (200, b"hello")
    assert origin.connections == 1
    assert http.connections_made == 1
    assert origin.heads[0].startswith(b"GET /a?sig=SECRET HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nx-ms-version: 1" in origin.heads[0]


async def test_a_connection_the_server_closed_while_idle_is_not_reused(nursery):
    # keep-alive by the headers, but the server closes after each answer
    origin = await start(nursery, answering(ok(b"x"), keep=False))
    http = client(origin)
    assert await get(http) == (200, b"x")
    await trio.sleep(0.05)  # the close reaches the client
    assert await get(http) == (200, b"x")
    assert origin.connections == 2
    assert http.resent == 0  # seen closed before it was used: nothing sent on it


async def test_a_request_lost_on_a_kept_alive_connection_is_sent_once_more(nursery):
    answered = 0

    async def handler(head: bytes, stream: trio.abc.Stream) -> bool:
        nonlocal answered
        if answered == 1 and origin.connections == 1:
            return False  # the second request on the first connection: closed unanswered
        answered += 1
        await stream.send_all(ok(b"%d" % answered))
        return True

    origin = await start(nursery, handler)
    http = client(origin)
    assert await get(http) == (200, b"1")
    assert await get(http) == (200, b"2")
    assert http.resent == 1
    assert origin.connections == 2


async def test_a_new_connection_closed_before_the_answer_is_not_sent_again(nursery):
    origin = await start(nursery, answering(b"", keep=False))
    http = client(origin)
    with pytest.raises(BodyCut, match="closed the connection before answering"):
        await get(http)
    assert len(origin.heads) == 1


async def test_connection_close_answers_are_not_kept(nursery):
    origin = await start(nursery, answering(ok(b"x", "Connection: close")))
    http = client(origin)
    for _ in range(2):
        assert await get(http) == (200, b"x")
    assert http.connections_made == 2


async def test_a_connection_idle_too_long_is_not_reused(nursery, monkeypatch):
    origin = await start(nursery, answering(ok(b"x")))
    http = client(origin)
    assert await get(http) == (200, b"x")
    clock = trio.current_time
    later = clock() + KEEPALIVE_S + 1
    monkeypatch.setattr("blobmount.storage.http1.time.monotonic", lambda: later)
    assert await get(http) == (200, b"x")
    assert http.connections_made == 2


async def test_a_released_answer_keeps_its_connection_only_when_read_to_the_end(nursery):
    origin = await start(nursery, answering(ok(b"0123456789")))
    http = client(origin)
    answer = await http.request("GET", "/", {})
    answer.release()  # body unread: the connection cannot be used again
    assert answer.done
    assert await get(http) == (200, b"0123456789")
    head = await http.request("HEAD", "/", {})
    assert head.headers["content-length"] == "10"
    head.release()  # a HEAD has no body: nothing left unread
    assert await get(http) == (200, b"0123456789")
    assert http.connections_made == 2


# -- bodies -----------------------------------------------------------------------------------


async def test_a_chunked_body_is_handed_over_piece_by_piece(nursery):
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\n\r\n"
    )
    origin = await start(nursery, answering(chunked))
    http = client(origin)
    answer = await http.request("GET", "/", {})
    pieces: list[bytes] = []
    assert await answer.read_into(pieces.append) == 11
    assert b"".join(pieces) == b"hello world"
    assert await get(http) == (200, b"hello world")  # kept: the last chunk was read
    assert http.connections_made == 1


async def test_a_body_without_length_lasts_until_the_connection_closes(nursery):
    origin = await start(nursery, answering(b"HTTP/1.1 200 OK\r\n\r\nall of it", keep=False))
    http = client(origin)
    assert await get(http) == (200, b"all of it")
    assert await get(http) == (200, b"all of it")
    assert http.connections_made == 2


async def test_a_body_cut_short_raises_body_cut(nursery):
    origin = await start(
        nursery, answering(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n12345", keep=False)
    )
    http = client(origin)
    answer = await http.request("GET", "/", {})
    with pytest.raises(BodyCut, match="after 5 of 100 body bytes"):
        await answer.read()
    assert answer.done


async def test_a_body_is_read_from_the_socket_as_it_arrives(nursery):
    big = bytes(range(256)) * 4096  # 1 MiB: several reads

    async def handler(head: bytes, stream: trio.abc.Stream) -> bool:
        await stream.send_all(
            b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\n\r\n" % len(big)
        )
        for start in range(0, len(big), 100_000):
            await stream.send_all(big[start : start + 100_000])
            await trio.sleep(0)
        return True

    origin = await start(nursery, handler)
    http = client(origin)
    answer = await http.request("GET", "/", {})
    pieces: list[bytes] = []
    await answer.read_into(pieces.append)
    assert answer.status == 206
    assert len(pieces) > 1
    assert b"".join(pieces) == big


async def test_an_interim_answer_is_skipped(nursery):
    origin = await start(nursery, answering(b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"real")))
    assert await get(client(origin)) == (200, b"real")


@pytest.mark.parametrize(
    "reply",
    [b"SSH-2.0-OpenSSH_9.2\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"],
    ids=["not-http", "bad-length"],
)
async def test_answers_that_are_not_http_are_protocol_errors(nursery, reply):
    origin = await start(nursery, answering(reply, keep=False))
    with pytest.raises(ProtocolError):
        await get(client(origin))


async def test_a_head_without_end_is_refused_past_its_limit(nursery):
    async def handler(head: bytes, stream: trio.abc.Stream) -> bool:
        await stream.send_all(b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"p" * 100_000)
        await trio.sleep_forever()
        return False

    origin = await start(nursery, handler)
    with pytest.raises(ProtocolError, match="head over"):
        await get(client(origin))


async def test_a_header_value_with_a_line_break_is_never_sent(nursery):
    origin = await start(nursery, answering(ok(b"")))
    with pytest.raises(ValueError, match="line break"):
        await client(origin).request("GET", "/", {"If-Match": '"x"\r\nEvil: 1'})
    assert origin.heads == []


# -- timeouts, cancellation, the limit --------------------------------------------------------


async def test_a_server_that_never_answers_times_out_per_read(nursery):
    async def handler(head: bytes, stream: trio.abc.Stream) -> bool:
        await trio.sleep_forever()
        return False

    origin = await start(nursery, handler)
    with trio.fail_after(5), pytest.raises(TimeoutError, match="no answer") as info:
        await get(client(origin, read_timeout_s=0.3))
    assert "SECRET" not in str(info.value)


async def test_connecting_to_a_full_accept_queue_times_out():
    with blackhole_port() as port:
        http = Http1Client(
            f"http://127.0.0.1:{port}",
            connect_timeout_s=0.5,
            read_timeout_s=5.0,
            max_connections=2,
            env={},
        )
        with trio.fail_after(10), pytest.raises(TimeoutError, match="connecting to"):
            await get(http)


async def test_a_refused_connection_names_its_endpoint():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    http = Http1Client(
        f"http://127.0.0.1:{port}", connect_timeout_s=2, read_timeout_s=2, max_connections=1, env={}
    )
    with pytest.raises(ConnectionRefusedError) as info:
        await get(http)
    assert (info.value.host, info.value.port) == ("127.0.0.1", port)  # type: ignore[attr-defined]


async def test_a_cancelled_request_gives_its_slot_back_and_closes_its_connection(nursery):
    async def handler(head: bytes, stream: trio.abc.Stream) -> bool:
        if b"GET /slow" in head:
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            await trio.sleep_forever()
        await stream.send_all(ok(b"fast"))
        return True

    origin = await start(nursery, handler)
    http = client(origin, max_connections=1)
    with trio.move_on_after(0.3) as scope:
        answer = await http.request("GET", "/slow", {})
        await answer.read()
    assert scope.cancelled_caught
    with trio.fail_after(5):  # the one slot is free again, on a new connection
        assert await get(http, "/fast") == (200, b"fast")
    assert http.connections_made == 2


async def test_at_most_max_connections_are_open_at_once(nursery):
    busy = 0
    most = 0

    async def handler(head: bytes, stream: trio.abc.Stream) -> bool:
        nonlocal busy, most
        busy += 1
        most = max(most, busy)
        await trio.sleep(0.05)
        busy -= 1
        await stream.send_all(ok(b"x"))
        return True

    origin = await start(nursery, handler)
    http = client(origin, max_connections=2)
    async with trio.open_nursery() as inner:
        for _ in range(6):
            inner.start_soon(get, http)
    assert most == 2
    assert http.connections_made == 2


# -- TLS --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def server_tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


def trusting(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


async def test_https_to_a_trusted_server(nursery, ca, server_tls):
    origin = await start(nursery, answering(ok(b"secret bytes")), tls=server_tls)
    http = client(origin, ssl_context=trusting(ca))
    assert await get(http) == (200, b"secret bytes")
    assert await get(http) == (200, b"secret bytes")
    assert http.connections_made == 1


async def test_https_to_an_untrusted_certificate_fails_with_the_ssl_reason(nursery, server_tls):
    origin = await start(nursery, answering(ok(b"")), tls=server_tls)
    http = client(origin)  # the system's CAs do not know trustme's
    with pytest.raises(ConnectionError, match="TLS handshake") as info:
        await get(http)
    assert isinstance(info.value.__cause__, ssl.SSLCertVerificationError)


async def test_https_through_a_connect_tunnel(nursery, ca, server_tls):
    origin = await start(nursery, answering(ok(b"tunnelled")), tls=server_tls)
    with ForwardProxy() as proxy:
        http = client(origin, ssl_context=trusting(ca), env={"HTTPS_PROXY": proxy.url})
        assert await get(http) == (200, b"tunnelled")
        assert await get(http) == (200, b"tunnelled")
        assert proxy.requests == [f"CONNECT 127.0.0.1:{origin.port}"]
    assert origin.heads[0].startswith(b"GET /a?sig=SECRET HTTP/1.1")  # inside the tunnel


# -- proxies ----------------------------------------------------------------------------------


async def test_http_through_a_proxy_names_the_whole_url_and_logs_in(nursery):
    proxy = await start(nursery, answering(ok(b"via proxy")))
    env = {"http_proxy": f"http://user:p%40ss@127.0.0.1:{proxy.port}"}
    http = Http1Client(
        "http://blobs.example:10000",
        connect_timeout_s=2,
        read_timeout_s=2,
        max_connections=1,
        env=env,
    )
    assert await get(http) == (200, b"via proxy")
    head = proxy.heads[0].decode()
    assert head.startswith("GET http://blobs.example:10000/a?sig=SECRET HTTP/1.1\r\n")
    assert "\r\nHost: blobs.example:10000\r\n" in head
    assert "\r\nProxy-Authorization: Basic dXNlcjpwQHNz" in head  # user:p@ss


async def test_a_proxy_that_cannot_be_reached_is_a_proxy_error():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    http = Http1Client(
        "https://acct.blob.core.windows.net",
        connect_timeout_s=2,
        read_timeout_s=2,
        max_connections=1,
        env={"HTTPS_PROXY": f"http://127.0.0.1:{port}"},
    )
    with pytest.raises(ProxyError, match=f"proxy 127.0.0.1:{port}") as info:
        await get(http)
    assert isinstance(info.value.__cause__, ConnectionRefusedError)


@pytest.mark.parametrize(
    ("scheme", "env", "route"),
    [
        ("http", {}, Route("h", 80)),
        ("http", {"HTTPS_PROXY": "http://p:3128"}, Route("h", 80)),
        ("https", {"HTTPS_PROXY": "http://p:3128"}, Route("p", 3128, tunnel=True)),
        ("http", {"HTTP_PROXY": "p:8080"}, Route("p", 8080, absolute_form=True)),
        (
            "http",
            {"HTTP_PROXY": "http://p:1", "http_proxy": "http://q:2"},
            Route("q", 2, absolute_form=True),
        ),
        ("http", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "h"}, Route("h", 80)),
        ("http", {"HTTP_PROXY": "http://p:1", "no_proxy": "*"}, Route("h", 80)),
        ("https", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": ".example"}, Route("h", 80)),
        ("http", {"ALL_PROXY": "http://p:1"}, Route("h", 80)),
    ],
)
def test_the_route_follows_the_proxy_variables(scheme, env, route):
    host = "h.example" if "example" in str(env) else "h"
    expected = route if route.host != "h" else Route(host, 80)
    assert route_for(scheme, host, 80, env) == expected


def test_a_proxy_that_is_not_http_is_refused_without_its_password():
    with pytest.raises(ProxyError, match="must be given as http://host:port") as info:
        route_for("https", "h", 443, {"HTTPS_PROXY": "socks5://u:hunter2@p:1080"})
    assert "hunter2" not in str(info.value)
