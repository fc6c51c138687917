"""One AzureStorageClient call through the fault proxy to Azurite: what each fault becomes, how
many HTTP requests it costs, and that the call ends within `call_deadline_s` whatever the proxy
does. The end-to-end bounds (tests/e2e/test_faults.py) are built on these facts.

Also: the proxy is transparent (Shared Key signs the path, not host:port), and the connect
timeout holds against a loopback listener whose accept queue is full (SYNs are dropped).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import trio

from blobmount.errors import (
    BlobChanged,
    BlobNotFound,
    CredentialError,
    StorageError,
    StorageUnavailable,
)
from blobmount.storage._aio_bridge import AsyncioBridge
from blobmount.storage.azure import AzureStorageClient
from blobmount.storage.retry import RetryingStorageClient
from blobmount.testing.pattern import pattern_bytes
from tests.helpers.blackhole import blackhole_port
from tests.helpers.fault_proxy import (
    Fault,
    cut_short,
    reset_mid_body,
    server_error,
    stall,
    stall_mid_body,
    throttle,
    trickle,
    truncate,
)

pytestmark = pytest.mark.azurite

MiB = 1024 * 1024
SIZE = 4 * MiB
CONNECT_S, READ_S = 1.0, 1.5
#: scheduling on a loaded machine; added to upper bounds only
SLACK_S = 10.0


@pytest.fixture(scope="module")
def uploaded(azurite) -> Iterator[tuple[str, str]]:
    """The container of x.bin, and x.bin's ETag. Tests that only need the ETag take it from
    here, not from a properties request through the proxy: with these clients' 1.5 s read
    timeout, an Azurite that pauses late in a long session failed such a set-up (CI)."""
    name = f"proxy-{uuid.uuid4().hex[:8]}"
    azurite.create_container(name)
    etag = azurite.upload(name, "x.bin", pattern_bytes("x", 0, SIZE))
    try:
        yield name, etag
    finally:
        azurite.delete_container(name)


@pytest.fixture
def blob_container(uploaded) -> str:
    return uploaded[0]


@pytest.fixture
def etag(uploaded) -> str:
    return uploaded[1]


@pytest.fixture
async def client(azurite, proxy, blob_container) -> AsyncIterator[AzureStorageClient]:
    with AsyncioBridge() as bridge:
        c = AzureStorageClient(
            proxy.account_url,
            blob_container,
            azurite.credential(),
            bridge=bridge,
            connect_timeout_s=CONNECT_S,
            read_timeout_s=READ_S,
        )
        try:
            yield c
        finally:
            proxy.clear()
            await c.aclose()


async def test_the_proxy_is_transparent(client, proxy):
    props = await client.get_properties("x.bin")
    assert props.size == SIZE
    assert await client.get_range("x.bin", props.etag, MiB, MiB) == pattern_bytes("x", MiB, MiB)
    page = await client.list_page("")
    assert [b.name for b in page.blobs] == ["x.bin"]
    assert proxy.counts("properties")["forwarded"] == 1
    assert proxy.counts("list")["forwarded"] == 1
    (get,) = proxy.records("range")
    assert get.if_match == props.etag
    assert get.range == f"bytes={MiB}-{2 * MiB - 1}"


CASES: dict[str, tuple[Fault, type[StorageError], int]] = {
    # fault, what get_range raises, HTTP range requests that one call makes
    "503": (throttle(retry_after="7"), StorageUnavailable, 1),
    "500": (server_error(500), StorageUnavailable, 1),
    "403": (server_error(403, "AuthorizationFailure"), CredentialError, 1),
    "404": (server_error(404, "BlobNotFound"), BlobNotFound, 1),
    "412": (server_error(412, "ConditionNotMet"), BlobChanged, 1),
    "stall before the first byte": (stall(None), StorageUnavailable, 1),
    # one call is one request: re-requesting is RetryingStorageClient's job alone
    "reset mid-body": (reset_mid_body(), StorageUnavailable, 1),
    "closed mid-body": (cut_short(), StorageUnavailable, 1),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_what_each_fault_becomes(client, proxy, etag, case):
    fault, error, requests = CASES[case]
    proxy.set_fault(fault)
    with pytest.raises(error) as info:
        await client.get_range("x.bin", etag, 0, 2 * MiB)
    assert proxy.counts("range")[fault.action] == requests
    assert proxy.counts("range")["requests"] == requests
    if case == "503":
        assert info.value.retry_after_s == 7.0


async def test_the_retry_layer_hides_one_broken_body(client, proxy, etag):
    proxy.set_fault(reset_mid_body(limit=1))
    retrying = RetryingStorageClient(client, retries=2, base_delay_s=0.01)
    assert await retrying.get_range("x.bin", etag, 0, 2 * MiB) == pattern_bytes("x", 0, 2 * MiB)
    assert proxy.counts("range") == {"requests": 2, "reset": 1, "forwarded": 1}
    assert retrying.statistics().retries == 1


@pytest.mark.parametrize(
    "fault",
    [
        stall_mid_body(None),
        trickle(bytes_per_step=1024, interval_s=0.25),
        truncate(after_bytes=64 * 1024),
    ],
    ids=["stall mid-body", "trickle", "truncated body"],
)
async def test_a_call_ends_within_its_deadline_whatever_the_body_does(client, proxy, etag, fault):
    deadline_s = client.call_deadline_s(2 * MiB)
    assert deadline_s == CONNECT_S + 2 * READ_S + 2.0
    proxy.set_fault(fault)
    started = time.monotonic()
    with pytest.raises(StorageUnavailable):
        await client.get_range("x.bin", etag, 0, 2 * MiB)
    assert time.monotonic() - started <= deadline_s + SLACK_S


async def test_stalled_first_byte_waits_one_read_timeout(client, proxy):
    props = await client.get_properties("x.bin")
    proxy.set_fault(stall(None, kinds=frozenset({"properties"})))
    started = time.monotonic()
    with pytest.raises(StorageUnavailable, match="timed out"):
        await client.get_properties("x.bin")
    elapsed = time.monotonic() - started
    assert READ_S - 0.1 <= elapsed <= client.call_deadline_s(0) + SLACK_S
    proxy.clear()
    assert (await client.get_properties("x.bin")).etag == props.etag  # the client recovers


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A loopback port whose accept queue is full: new SYNs are dropped, connects hang."""
    with blackhole_port(fillers=3) as port:
        yield port


async def test_connect_timeout(azurite, blackhole):
    with AsyncioBridge() as bridge:
        client = AzureStorageClient(
            f"http://127.0.0.1:{blackhole}/{azurite.account}",
            "c",
            azurite.credential(),
            bridge=bridge,
            connect_timeout_s=CONNECT_S,
            read_timeout_s=30.0,
        )
        try:
            started = time.monotonic()
            with trio.fail_after(client.call_deadline_s(0) + SLACK_S):
                with pytest.raises(StorageUnavailable, match="timed out") as info:
                    await client.get_properties("x.bin")
            elapsed = time.monotonic() - started
            # the connect timeout fired, not the call's deadline (61 s here)
            assert CONNECT_S - 0.1 <= elapsed <= CONNECT_S + SLACK_S
            assert "no complete answer" not in str(info.value)
        finally:
            await client.aclose()
