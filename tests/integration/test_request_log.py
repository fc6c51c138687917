"""The storage request debug log and the request ids in error messages, against Azurite.

AzureStorageClient talks to Azurite through the fault proxy (tests/helpers/fault_proxy.py),
which records the x-ms-client-request-id of every request it sees: each debug line must name
exactly the id that was sent, one line per request, and every StorageError the client raises
must name the id of its call, so a user can hand it to Azure support. Both credential kinds
that put a secret in the URL (an account key, from which the client signs a SAS, and a SAS
token) are used, and no secret may reach a line.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta

import pytest
import trio
from azure.core.credentials import AzureSasCredential
from azure.storage.blob import ContainerSasPermissions, generate_container_sas

from blobmount.errors import (
    BlobChanged,
    BlobNotFound,
    ContainerNotFound,
    CredentialError,
    StorageError,
    StorageUnavailable,
)
from blobmount.logs import FORMAT, RedactingFormatter
from blobmount.storage import request_log
from blobmount.storage.azure import AzureStorageClient
from blobmount.storage.overload import Throttled, TimedOut
from blobmount.testing.azurite import free_port
from tests.helpers.fault_proxy import ALL_KINDS, Fault, cut_short, server_error, throttle, truncate

pytestmark = pytest.mark.azurite

#: one request line, field by field
LINE = re.compile(
    r"(?P<method>GET|HEAD) (?P<path>\S+)(?P<list> list)?(?: range=(?P<range>\d+-\d+))? "
    r"status=(?P<status>\d{3}|-)(?: error=(?P<error>\w+))? ms=(?P<ms>\d+\.\d) "
    r"(?:bytes=(?P<bytes>\d+) )?"
    r"x-ms-client-request-id=(?P<client>[0-9a-f-]{36}) x-ms-request-id=(?P<server>\S+)$"
)
UUID = re.compile(r"\[client request id ([0-9a-f-]{36})\]")


def _sas_token(azurite, container: str) -> str:
    return generate_container_sas(
        azurite.account,
        container,
        account_key=azurite.account_key,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )


@pytest.fixture(params=["account-key", "sas-token"])
def credential(request, azurite, container):
    """(credential, the secrets it must never leak)"""
    if request.param == "account-key":
        return azurite.credential(), [azurite.account_key]
    token = _sas_token(azurite, container)
    signature = re.search(r"sig=([^&]+)", token)
    assert signature is not None
    return AzureSasCredential(token), [token, signature.group(1)]


def _lines(caplog) -> list[re.Match[str]]:
    records = [r for r in caplog.records if r.name == request_log.__name__]
    matches = []
    for record in records:
        match = LINE.match(record.getMessage())
        assert match is not None, record.getMessage()
        matches.append(match)
    return matches


def _run(client, fn):
    async def main():
        try:
            return await fn(client)
        finally:
            await client.aclose()

    return trio.run(main)


def test_each_request_is_logged_once_with_its_fields(azurite, container, proxy, credential, caplog):
    cred, secrets = credential
    etag = azurite.upload(container, "dir/a b.bin", b"0123456789")
    azurite.upload(container, "dir/other.txt", b"x")
    client = AzureStorageClient(proxy.account_url, container, cred)
    caplog.set_level(logging.DEBUG, logger=request_log.__name__)
    errors: list[StorageError] = []

    async def requests(c: AzureStorageClient) -> None:
        await c.list_page("dir/")
        await c.get_properties("dir/a b.bin")
        assert await c.get_range("dir/a b.bin", etag, 2, 5) == b"23456"
        with pytest.raises(BlobNotFound) as gone:
            await c.get_properties("dir/missing")
        errors.append(gone.value)
        azurite.upload(container, "dir/other.txt", b"changed")
        with pytest.raises(BlobChanged) as changed:  # 412, then a HEAD to tell changed from gone
            await c.get_range("dir/other.txt", etag, 0, 1)
        errors.append(changed.value)

    _run(client, requests)
    lines = _lines(caplog)
    where = f"{azurite.account}/{container}"
    assert [(m["method"], m["path"], m["status"]) for m in lines] == [
        ("GET", f"{where}/dir/", "200"),
        ("HEAD", f"{where}/dir/a%20b.bin", "200"),
        ("GET", f"{where}/dir/a%20b.bin", "206"),
        ("HEAD", f"{where}/dir/missing", "404"),
        ("GET", f"{where}/dir/other.txt", "412"),
        ("HEAD", f"{where}/dir/other.txt", "200"),
    ]
    assert lines[0]["list"]
    assert not any(m["list"] for m in lines[1:])
    assert lines[2]["range"] == "2-6"
    assert lines[2]["bytes"] == "5"
    assert all(float(m["ms"]) >= 0 for m in lines)
    # Azurite answers every request with an id of its own, as Azure does
    servers = [m["server"] for m in lines]
    assert "-" not in servers
    assert len(set(servers)) == len(servers)

    # the id in each line is the one the request carried, one line per request sent
    sent = [r.client_request_id for r in proxy.records()]
    assert [m["client"] for m in lines] == sent
    # one id per call: the 412 and the HEAD that followed it are one call
    assert len(set(sent)) == 5
    assert sent[4] == sent[5]
    # and each failure names the id of its call
    assert [UUID.search(str(e)).group(1) for e in errors] == [sent[3], sent[4]]  # type: ignore[union-attr]

    for record in caplog.records:
        text = RedactingFormatter(FORMAT).format(record)
        assert text.endswith(record.getMessage())  # the second line of defence had nothing to do
        for secret in secrets:
            assert secret not in text
        assert "sig=" not in text
        assert "AccountKey" not in text


def test_no_request_is_described_when_debug_is_off(azurite, container, caplog, monkeypatch):
    etag = azurite.upload(container, "a.bin", b"abc")

    def not_called(*args: object) -> str:
        raise AssertionError("a request was described with DEBUG off")

    monkeypatch.setattr("blobmount.storage.azure.describe_url", not_called)
    caplog.set_level(logging.INFO)
    client = AzureStorageClient(azurite.account_url, container, azurite.credential())

    async def requests(c: AzureStorageClient) -> None:
        await c.list_page("")
        assert await c.get_range("a.bin", etag, 0, 3) == b"abc"
        with pytest.raises(BlobNotFound):
            await c.get_properties("missing")

    _run(client, requests)
    assert [r for r in caplog.records if r.name == request_log.__name__] == []


def test_a_request_with_no_answer_is_logged_and_its_failure_names_it(caplog):
    caplog.set_level(logging.DEBUG, logger=request_log.__name__)
    client = AzureStorageClient(
        f"http://127.0.0.1:{free_port()}/devstoreaccount1", "c", None, connect_timeout_s=2
    )
    with pytest.raises(StorageUnavailable) as failed:
        _run(client, lambda c: c.get_properties("x"))
    (line,) = _lines(caplog)
    assert line["status"] == "-"
    assert line["error"] == "ConnectionRefusedError"
    assert line["server"] == "-"
    assert f"[client request id {line['client']}]" in str(failed.value)


# -- every StorageError the client raises names its request ------------------------------


def _status(status: int, code: str) -> Fault:
    return Fault("status", status=status, code=code, kinds=ALL_KINDS)


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (throttle(), Throttled),
        (server_error(502, "BadGateway"), StorageUnavailable),
        (_status(403, "AuthenticationFailed"), CredentialError),
        (truncate(after_bytes=1000), StorageUnavailable),  # a well-framed short body
        (cut_short(after_bytes=1000), StorageUnavailable),  # the connection closed mid-body
        (Fault("stall", stall_s=5.0), TimedOut),  # no first byte within the read timeout
        (Fault("trickle", trickle_bytes=512, trickle_interval_s=0.05), TimedOut),  # the deadline
    ],
    ids=["throttled", "502", "403", "truncated", "cut-short", "stalled", "trickled"],
)
def test_every_failure_names_the_request_id_that_was_sent(
    azurite, container, proxy, fault, expected
):
    etag = azurite.upload(container, "big.bin", b"z" * 200_000)
    proxy.set_fault(fault)
    client = AzureStorageClient(
        proxy.account_url,
        container,
        azurite.credential(),
        connect_timeout_s=0.5,
        read_timeout_s=0.5,
    )
    with pytest.raises(expected) as failed:
        _run(client, lambda c: c.get_range("big.bin", etag, 0, 200_000))
    proxy.clear()
    sent = {r.client_request_id for r in proxy.records()}
    named = UUID.findall(str(failed.value))
    assert len(named) == 1, str(failed.value)
    assert named[0] in sent


@pytest.mark.parametrize("what", ["container", "blob", "changed", "changed-empty-range", "props"])
def test_not_found_and_changed_name_the_request_id(azurite, container, proxy, what):
    etag = azurite.upload(container, "a.bin", b"abc")
    name = "missing-container" if what == "container" else container
    client = AzureStorageClient(proxy.account_url, name, azurite.credential())

    async def call(c: AzureStorageClient) -> object:
        if what == "container":
            return await c.list_page("")
        if what == "blob":
            return await c.get_range("nope.bin", etag, 0, 3)
        if what == "props":
            return await c.get_range_with_props("nope.bin", etag, 0, 3)
        azurite.upload(container, "a.bin", b"new")
        # a 0-byte read still checks the version, and says which request found it changed
        return await c.get_range("a.bin", etag, 0, 0 if what == "changed-empty-range" else 3)

    expected = {"container": ContainerNotFound, "blob": BlobNotFound, "props": BlobNotFound}
    with pytest.raises(expected.get(what, BlobChanged)) as failed:
        _run(client, call)
    sent = [r.client_request_id for r in proxy.records()]
    named = UUID.findall(str(failed.value))
    assert named == [sent[-1]], (str(failed.value), sent)
