"""AzureStorageClient against a scripted HTTP server on 127.0.0.1: the failures Azurite never
produces (throttling with Retry-After, 5xx, short bodies, resets, stalls), and that each becomes
the right blobmount error with a message that names the blob and status and holds no secret.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import pytest
import trio
from azure.core.credentials import AzureSasCredential

from blobmount.errors import StorageError, StorageUnavailable
from blobmount.storage._aio_bridge import AsyncioBridge
from blobmount.storage.azure import AzureStorageClient, parse_retry_after

SAS = "sv=2024-08-04&sr=c&sp=rl&se=2031-01-01T00%3A00%3A00Z&sig=TOPSECRETSIGNATURE%3D"
ETAG = '"0x8DEADBEEF"'


def response(status: int, reason: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    head = [f"HTTP/1.1 {status} {reason}"]
    headers = {"Connection": "close", "x-ms-request-id": "r1", "x-ms-version": "2025-01-05"} | (
        headers
    )
    head += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def error(status: int, reason: str, code: str, extra: dict[str, str] | None = None) -> bytes:
    body = (
        f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code>'
        f"<Message>scripted</Message></Error>"
    ).encode()
    headers = {
        "Content-Type": "application/xml",
        "Content-Length": str(len(body)),
        "x-ms-error-code": code,
    }
    return response(status, reason, headers | (extra or {}), body)


def partial_content(start: int, end: int, total: int, body: bytes, length: int) -> bytes:
    """206 whose Content-Range says [start, end] of `total`, with `length` as Content-Length."""
    return response(
        206,
        "Partial Content",
        {
            "Content-Length": str(length),
            "Content-Range": f"bytes {start}-{end}/{total}",
            "Content-Type": "application/octet-stream",
            "ETag": ETAG,
            "Last-Modified": "Mon, 01 Jan 2024 00:00:00 GMT",
            "x-ms-blob-type": "BlockBlob",
        },
        body,
    )


@dataclass
class ScriptedServer:
    """Answers each request with the next scripted reply: bytes, or None to stall forever."""

    replies: list[bytes | None] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    port: int = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                head += chunk
            self.requests.append(head.split(b"\r\n", 1)[0].decode())
            reply = self.replies.pop(0) if self.replies else error(500, "Nope", "NoScript")
            if reply is None:
                await trio.sleep_forever()
            if head.startswith(b"HEAD "):
                reply = reply[: reply.index(b"\r\n\r\n") + 4]  # HEAD answers carry no body
            await stream.send_all(reply)


@pytest.fixture
async def server(nursery):
    srv = ScriptedServer()
    listeners = await nursery.start(partial(trio.serve_tcp, srv.handle, 0, host="127.0.0.1"))
    srv.port = listeners[0].socket.getsockname()[1]
    return srv


@pytest.fixture
async def make_client(server):
    clients: list[AzureStorageClient] = []
    with AsyncioBridge() as bridge:

        def make(**kwargs: object) -> AzureStorageClient:
            kwargs.setdefault("read_timeout_s", 5.0)
            client = AzureStorageClient(
                f"http://127.0.0.1:{server.port}/acct",
                "cont",
                AzureSasCredential(SAS),
                bridge=bridge,
                connect_timeout_s=2.0,
                **kwargs,  # type: ignore[arg-type]
            )
            clients.append(client)
            return client

        try:
            yield make
        finally:
            for client in clients:
                await client.aclose()


def assert_clean(exc: BaseException, *must: str) -> None:
    text = f"{exc!s} {exc!r}"
    assert "TOPSECRET" not in text
    assert "sig=" not in text
    for word in must:
        assert word in text, text


Call = Callable[[AzureStorageClient], object]
CALLS: dict[str, Call] = {
    "list": lambda c: c.list_page("dir/"),
    "props": lambda c: c.get_properties("dir/blob.bin"),
    "range": lambda c: c.get_range("dir/blob.bin", ETAG, 0, 100),
}


@pytest.mark.parametrize("op", list(CALLS))
async def test_throttling_is_unavailable_with_retry_after_seconds(server, make_client, op):
    server.replies.append(error(503, "Server Busy", "ServerBusy", {"Retry-After": "7"}))
    with pytest.raises(StorageUnavailable) as info:
        await CALLS[op](make_client())
    assert info.value.retry_after_s == 7.0
    assert_clean(info.value, "503", "ServerBusy", "acct/cont/dir/")


async def test_retry_after_as_http_date(server, make_client):
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    server.replies.append(error(429, "Too Many Requests", "TooManyRequests", {"Retry-After": when}))
    with pytest.raises(StorageUnavailable) as info:
        await make_client().get_properties("x")
    assert 25 <= info.value.retry_after_s <= 31


@pytest.mark.parametrize("status", [408, 500, 502, 504])
async def test_transient_statuses(server, make_client, status):
    server.replies.append(error(status, "Transient", "InternalError"))
    with pytest.raises(StorageUnavailable) as info:
        await make_client().list_page("")
    assert info.value.retry_after_s is None
    assert_clean(info.value, str(status))


async def test_other_statuses_are_plain_storage_errors(server, make_client):
    server.replies.append(error(400, "Bad Request", "InvalidQueryParameterValue"))
    with pytest.raises(StorageError) as info:
        await make_client().list_page("")
    assert type(info.value) is StorageError
    assert_clean(info.value, "400", "InvalidQueryParameterValue")


async def test_content_range_longer_than_body_is_a_short_body(server, make_client):
    # the server claims bytes 0-99 but sends (and declares) only 40; asked for the rest, it
    # sends nothing
    server.replies += [
        partial_content(0, 99, 1000, b"x" * 40, 40),
        partial_content(40, 99, 1000, b"", 0),
    ]
    with pytest.raises(StorageUnavailable, match="short body") as info:
        await make_client().get_range("dir/blob.bin", ETAG, 0, 100)
    assert_clean(info.value, "dir/blob.bin")


async def test_a_short_body_cut_into_parts_is_a_short_body(server, make_client):
    server.replies.append(partial_content(0, 99, 1000, b"x" * 40, 40))
    with pytest.raises(StorageUnavailable, match="short body") as info:
        await make_client().get_range_parts("dir/blob.bin", ETAG, 0, [50, 50])
    assert_clean(info.value, "dir/blob.bin")


async def test_a_whole_blob_answer_is_cut_at_the_asked_range(server, make_client):
    # a server that ignores the range sends the whole blob with a 200
    body = bytes(range(256)) * 4
    headers = {"Content-Length": str(len(body)), "ETag": ETAG, "x-ms-blob-type": "BlockBlob"}
    server.replies += [response(200, "OK", headers, body)] * 2
    client = make_client()
    assert await client.get_range_parts("dir/blob.bin", ETAG, 100, [10, 20]) == [
        body[100:110],
        body[110:130],
    ]
    assert await client.get_range("dir/blob.bin", ETAG, 1000, 100) == body[1000:]


async def test_connection_closed_mid_body_is_unavailable(server, make_client):
    # Content-Length 100, 10 bytes, then close. The SDK re-requests a broken body itself
    # (3 attempts, 1 s apart) before giving up; every attempt is cut short here.
    server.replies += [partial_content(0, 99, 1000, b"y" * 10, 100)] * 3
    with trio.fail_after(20), pytest.raises(StorageUnavailable) as info:
        await make_client().get_range("dir/blob.bin", ETAG, 0, 100)
    assert_clean(info.value, "dir/blob.bin")


async def test_stalled_response_times_out(server, make_client):
    server.replies.append(None)
    with trio.fail_after(10), pytest.raises(StorageUnavailable, match="timed out") as info:
        await make_client(read_timeout_s=0.5).get_properties("dir/blob.bin")
    assert_clean(info.value, "dir/blob.bin")


async def test_good_range_through_the_same_server(server, make_client):
    server.replies.append(partial_content(10, 19, 1000, bytes(range(10)), 10))
    data = await make_client().get_range("dir/blob.bin", ETAG, 10, 10)
    assert data == bytes(range(10))
    assert server.requests[0].startswith("GET /acct/cont/dir/blob.bin?")


async def test_cancelled_get_leaves_the_client_usable(server, make_client):
    client = make_client()
    server.replies += [None, partial_content(0, 3, 4, b"abcd", 4)]
    with trio.move_on_after(0.5) as scope:
        await client.get_range("dir/blob.bin", ETAG, 0, 4)
    assert scope.cancelled_caught
    with trio.fail_after(10):
        assert await client.get_range("dir/blob.bin", ETAG, 0, 4) == b"abcd"


async def test_closed_client_refuses_calls(make_client):
    client = make_client()
    await client.aclose()
    with pytest.raises(StorageError, match="closed"):
        await client.get_properties("x")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("5", 5.0), (" 0 ", 0.0), ("-3", 0.0), ("1.5", 1.5), ("soon", None)],
)
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value) == expected


def test_parse_retry_after_http_date():
    now = 1_700_000_000.0
    assert parse_retry_after(email.utils.formatdate(now + 42, usegmt=True), now=now) == 42.0
    assert parse_retry_after(email.utils.formatdate(now - 42, usegmt=True), now=now) == 0.0
