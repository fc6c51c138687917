"""The lean REST client's pure parts: reading List Blobs XML and HEAD headers, and how each
credential type authorises a request (the wire itself is tested against Azurite in
tests/integration/test_storage_contract.py and against scripted failures in
test_azure_faults.py / test_fault_proxy.py)."""

from __future__ import annotations

import asyncio
import base64
import email.utils
from collections.abc import Awaitable
from types import SimpleNamespace
from urllib.parse import parse_qs

import pytest
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from multidict import CIMultiDict

from blobmount.errors import CredentialError
from blobmount.storage import rest_auth
from blobmount.storage.rest_auth import (
    AnonymousAuth,
    BearerAuth,
    KeySasAuth,
    SasAuth,
    request_auth,
)
from blobmount.storage.rest_parse import (
    http_date,
    parse_list_page,
    props_from_headers,
    quoted_etag,
)

KEY = base64.b64encode(b"k" * 64).decode()


def run(coro: Awaitable[str]) -> str:
    async def main() -> str:
        return await coro

    return asyncio.run(main())


# -- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["Tue, 21 Nov 2026 23:04:10 GMT", "Sat, 01 Jan 2000 00:00:00 GMT", "Mon, 9 Feb 2026 1:2:3 GMT"],
)
def test_http_date_matches_the_standard_library(value):
    assert http_date(value) == email.utils.parsedate_to_datetime(value).timestamp()


@pytest.mark.parametrize("value", [None, "", "yesterday", "Tue, 99 Foo 2026 23:04:10 GMT"])
def test_unreadable_dates_are_zero(value):
    assert http_date(value) == 0.0


LIST_XML = b"""<?xml version="1.0" encoding="utf-8"?>
<EnumerationResults ServiceEndpoint="http://127.0.0.1/acct" ContainerName="c">
  <Prefix>d/</Prefix><MaxResults>5000</MaxResults><Delimiter>/</Delimiter>
  <Blobs>
    <Blob><Name>d/a.bin</Name><Properties>
      <Last-Modified>Tue, 21 Nov 2026 23:04:10 GMT</Last-Modified><Etag>0x8D1</Etag>
      <Content-Length>25000</Content-Length><Content-MD5>ICAgICAgICAgICAgICAgIA==</Content-MD5>
    </Properties><Metadata /></Blob>
    <BlobPrefix><Name>d/sub/</Name></BlobPrefix>
    <Blob><Name>d/marker</Name><Properties><Etag>"0x8D2"</Etag><Content-Length>0</Content-Length>
      <Content-MD5 /></Properties><Metadata><HDI_IsFolder>True</HDI_IsFolder></Metadata></Blob>
    <Blob><Name Encoded="true">d/%EF%BF%BEodd</Name><Properties><Etag>0x8D3</Etag>
      <Content-Length>0</Content-Length></Properties></Blob>
  </Blobs>
  <NextMarker>2!token</NextMarker>
</EnumerationResults>"""


def test_list_page_blobs_prefixes_and_marker():
    page = parse_list_page(LIST_XML)
    a, marker, odd = page.blobs
    assert (a.name, a.size, a.etag, a.content_md5) == ("d/a.bin", 25000, '"0x8D1"', b" " * 16)
    assert a.last_modified == http_date("Tue, 21 Nov 2026 23:04:10 GMT")
    assert not a.is_dir_marker
    assert (marker.name, marker.etag, marker.content_md5) == ("d/marker", '"0x8D2"', None)
    assert marker.is_dir_marker  # the flag's name and value in any case
    assert odd.name == "d/\ufffeodd"  # percent-encoded because XML cannot carry it
    assert not odd.is_dir_marker
    assert odd.last_modified == 0.0
    assert page.prefixes == ("d/sub/",)
    assert page.continuation == "2!token"


def test_last_list_page_has_no_continuation():
    page = parse_list_page(b"<EnumerationResults><Blobs /><NextMarker /></EnumerationResults>")
    assert page == type(page)((), (), None)


@pytest.mark.parametrize(
    "body", [b"not xml", b"<Error><Code>InternalError</Code></Error>", b""], ids=str
)
def test_a_body_that_is_no_listing_is_a_value_error(body):
    with pytest.raises(ValueError):
        parse_list_page(body)


def test_props_from_headers():
    headers = CIMultiDict(
        {
            "content-length": "0",
            "ETag": '"0x8D9"',
            "Last-Modified": "Sat, 01 Jan 2000 00:00:00 GMT",
            "Content-MD5": "not base64!",
            "x-ms-meta-Hdi_IsFolder": "true",
        }
    )
    props = props_from_headers("x", headers)
    assert (props.size, props.etag, props.content_md5, props.is_dir_marker) == (
        0,
        '"0x8D9"',
        None,
        True,
    )
    assert props.last_modified == 946684800.0
    headers["Content-Length"] = "7"
    assert not props_from_headers("x", headers).is_dir_marker  # a marker has no bytes


def test_quoted_etag():
    assert quoted_etag("0x1") == '"0x1"' == quoted_etag('"0x1"')
    assert quoted_etag('W/"0x1"') == 'W/"0x1"'


# -- authorisation -------------------------------------------------------------------------


def test_request_auth_picks_by_credential_type():
    assert isinstance(request_auth(None, "acct", "c"), AnonymousAuth)
    assert isinstance(request_auth("sv=1&sig=x", "acct", "c"), SasAuth)
    assert isinstance(request_auth(AzureSasCredential("sig=x"), "acct", "c"), SasAuth)
    assert isinstance(request_auth(AzureNamedKeyCredential("acct", KEY), "acct", "c"), KeySasAuth)
    key_dict = {"account_name": "acct", "account_key": KEY}
    assert isinstance(request_auth(key_dict, "acct", "c"), KeySasAuth)
    assert isinstance(
        request_auth(SimpleNamespace(get_token=lambda *a: None), "a", "c"), BearerAuth
    )
    with pytest.raises(CredentialError, match="unsupported credential type int"):
        request_auth(42, "acct", "c")


def test_sas_is_read_at_each_request():
    credential = AzureSasCredential("?sv=1&sig=old")
    auth = SasAuth(credential)
    headers: dict[str, str] = {}
    assert run(auth.authorize(headers)) == "sv=1&sig=old"
    credential.update("sv=1&sig=new")
    assert run(auth.authorize(headers)) == "sv=1&sig=new"
    assert headers == {}


def test_key_sas_is_read_list_only_and_renewed_before_expiry(monkeypatch):
    now = [1_800_000_000.0]
    monkeypatch.setattr(rest_auth.time, "time", lambda: now[0])
    auth = KeySasAuth("acct", KEY, "cont")
    first = run(auth.authorize({}))
    fields = parse_qs(first)
    assert fields["sp"] == ["rl"]
    assert fields["sr"] == ["c"]
    assert "sig" in fields
    assert KEY not in first
    now[0] += 60
    assert run(auth.authorize({})) == first  # cached
    now[0] += rest_auth._KEY_SAS_LIFETIME_S - rest_auth._KEY_SAS_RENEW_S
    renewed = run(auth.authorize({}))
    assert renewed != first
    assert parse_qs(renewed)["se"] != fields["se"]


def test_a_key_that_cannot_sign_is_a_credential_error():
    auth = KeySasAuth("acct", "not base64 at all", "cont")
    with pytest.raises(CredentialError, match="cannot sign") as info:
        run(auth.authorize({}))
    assert "not base64 at all" not in str(info.value)


class FakeTokenCredential:
    def __init__(self, *, lifetime_s: float, is_async: bool) -> None:
        self.lifetime_s = lifetime_s
        self.is_async = is_async
        self.calls: list[str] = []

    def _token(self, scope: str) -> SimpleNamespace:
        self.calls.append(scope)
        return SimpleNamespace(
            token=f"token-{len(self.calls)}", expires_on=rest_auth.time.time() + self.lifetime_s
        )

    def get_token(self, scope: str) -> object:
        if not self.is_async:
            return self._token(scope)

        async def later() -> SimpleNamespace:
            await asyncio.sleep(0.01)  # concurrent callers pile up behind the first
            return self._token(scope)

        return later()


@pytest.mark.parametrize("is_async", [True, False])
def test_bearer_token_is_fetched_once_and_cached(is_async):
    credential = FakeTokenCredential(lifetime_s=3600, is_async=is_async)
    auth = BearerAuth(credential)

    async def many() -> list[dict[str, str]]:
        headers: list[dict[str, str]] = [{} for _ in range(20)]
        queries = await asyncio.gather(*(auth.authorize(h) for h in headers))
        assert set(queries) == {""}
        return headers

    headers = asyncio.run(many())
    assert {h["Authorization"] for h in headers} == {"Bearer token-1"}
    assert credential.calls == [rest_auth.STORAGE_SCOPE]


def test_bearer_token_is_renewed_near_expiry():
    credential = FakeTokenCredential(lifetime_s=rest_auth._TOKEN_RENEW_S - 1, is_async=False)
    auth = BearerAuth(credential)
    first: dict[str, str] = {}
    second: dict[str, str] = {}
    run(auth.authorize(first))
    run(auth.authorize(second))
    assert (first["Authorization"], second["Authorization"]) == ("Bearer token-1", "Bearer token-2")
