"""What a mount says when its first storage request fails: the real Azure client against
endpoints on this machine that refuse, do not resolve, do not answer, or for which no token can
be had, through `check_source` (what the daemon runs before mounting)."""

from __future__ import annotations

import os
import socket
import ssl
import threading
from collections.abc import Iterator

import pytest

from blobmount.compose.diagnosis import causes, endpoint_of, explain
from blobmount.compose.storage import check_source, open_storage
from blobmount.datastores import resolve_source
from blobmount.errors import (
    ContainerNotFound,
    CredentialError,
    StorageError,
    StorageUnavailable,
)
from blobmount.settings import load_settings
from blobmount.storage.azure_auth import DEV_ACCOUNT, DEV_KEY


def _connection_string(endpoint: str) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};"
        f"BlobEndpoint={endpoint}/{DEV_ACCOUNT}"
    )


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for name in list(os.environ):
        if name.startswith(("AZURE_", "DATASET_", "AZUREML_", "RSLEX_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))  # no token cache or CLI login of the machine's


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield int(sock.getsockname()[1])


async def _refusal(uri: str, **settings: str) -> StorageError:
    env = {"AZUREML_DATASET_HTTP_RETRY_COUNT": "0", **settings}
    spec = resolve_source(uri)
    with pytest.raises(StorageError) as info:
        async with open_storage(load_settings(env), spec) as stack:
            await check_source(stack.client, spec)
    return info.value


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


async def test_a_refused_connection_names_the_endpoint(clean_env, closed_port, monkeypatch):
    endpoint = f"http://127.0.0.1:{closed_port}"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", _connection_string(endpoint))
    exc = await _refusal(f"{endpoint}/{DEV_ACCOUNT}/data")
    assert isinstance(exc, StorageUnavailable)
    text = _one_line(exc)
    assert text.startswith(f"cannot mount {endpoint}/{DEV_ACCOUNT}/data: ")
    assert f"127.0.0.1:{closed_port} refused the connection" in text
    assert "check the endpoint's host and port" in text
    assert DEV_KEY not in text


async def test_a_name_that_does_not_resolve_is_named(clean_env, monkeypatch):
    real = socket.getaddrinfo

    def no_such_host(host, *args, **kwargs):
        if host == "nosuch.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    endpoint = "http://nosuch.invalid:10000"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", _connection_string(endpoint))
    exc = await _refusal(f"{endpoint}/{DEV_ACCOUNT}/data")
    assert isinstance(exc, StorageUnavailable)
    text = _one_line(exc)
    assert "the host name nosuch.invalid does not resolve (Name or service not known)" in text
    assert "DNS" in text


async def test_an_endpoint_that_never_answers_is_named(clean_env, silent_server, monkeypatch):
    endpoint = f"http://127.0.0.1:{silent_server}"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", _connection_string(endpoint))
    exc = await _refusal(f"{endpoint}/{DEV_ACCOUNT}/data", DATASET_MOUNT_READ_TIMEOUT_SECONDS="0.3")
    assert isinstance(exc, StorageUnavailable)
    text = _one_line(exc)
    assert f"127.0.0.1:{silent_server} did not answer in time" in text
    assert "DATASET_MOUNT_READ_TIMEOUT_SECONDS" in text


@pytest.fixture
def plain_http_server() -> Iterator[int]:
    """A port whose server answers anything with plain HTTP, as an emulator does."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(sock.getsockname()[1])
    sock.close()
    thread.join(timeout=5)


async def test_https_to_a_server_without_tls_is_named(clean_env, plain_http_server, monkeypatch):
    endpoint = f"https://127.0.0.1:{plain_http_server}"
    connection = _connection_string(endpoint).replace("Protocol=http;", "Protocol=https;")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection)
    exc = await _refusal(f"{endpoint}/{DEV_ACCOUNT}/data")
    text = _one_line(exc)
    assert f"the TLS handshake with 127.0.0.1:{plain_http_server} failed (WRONG_VERSION" in text
    assert "http:// for an emulator" in text


def test_a_certificate_not_trusted_is_named() -> None:
    bad = ssl.SSLCertVerificationError(1, "certificate verify failed")
    bad.verify_message = "self-signed certificate"  # as the ssl module sets it
    exc = _raised_from_none(StorageUnavailable("list a/b/: connection failed"), bad)
    text = explain(exc, "acct.blob.core.windows.net")
    assert "the TLS certificate of acct.blob.core.windows.net was not accepted" in text
    assert "(self-signed certificate)" in text


async def test_no_token_says_which_credentials_were_tried(clean_env, monkeypatch):
    # only the developer credentials (CLI logins, caches): nothing here, and no network asked
    monkeypatch.setenv("AZURE_TOKEN_CREDENTIALS", "dev")
    monkeypatch.setenv("PATH", "/nonexistent")  # no `az`, `azd` or `pwsh` to ask
    exc = await _refusal(f"https://127.0.0.1:1/{DEV_ACCOUNT}/data")
    assert isinstance(exc, CredentialError)
    text = _one_line(exc)
    assert "the credential chain tried " in text
    assert "AzureCliCredential (" in text
    assert "AZURE_STORAGE_CONNECTION_STRING" in text  # what to do instead


# -- the message parts, on exceptions made here --------------------------------------------


def _raised_from_none(outer: StorageError, inner: BaseException) -> StorageError:
    """`outer` raised as a storage client does: `from None` while handling `inner`."""
    try:
        try:
            raise inner
        except BaseException:
            raise outer from None
    except StorageError as exc:
        return exc


def test_causes_follow_what_a_client_hid_with_from_none() -> None:
    refused = ConnectionRefusedError(111, "Connection refused")
    exc = _raised_from_none(StorageUnavailable("list a/b/: connection failed"), refused)
    assert causes(exc) == [exc, refused]
    assert "refused the connection" in explain(exc, "127.0.0.1:9")


def test_credential_reasons_are_short_and_secrets_are_redacted() -> None:
    class ClientAuthenticationError(Exception):  # named as azure-core's
        pass

    token = ClientAuthenticationError(
        "DefaultAzureCredential failed to retrieve a token from the included credentials.\n"
        "Attempted credentials:\n"
        "\tEnvironmentCredential: Authentication failed: see https://x.example/?sig=SECRET123\n"
        "\tManagedIdentityCredential: ManagedIdentityCredential authentication unavailable. "
        "No identity has been assigned to this resource. More text.\n"
    )
    exc = _raised_from_none(CredentialError("list a/b/: could not get a token"), token)
    text = explain(exc)
    assert "SECRET123" not in text
    assert "EnvironmentCredential (Authentication failed: see <url>)" in text
    assert "ManagedIdentityCredential (No identity has been assigned to this resource)" in text


def test_refused_credentials_and_a_missing_container_say_what_to_check() -> None:
    refused = explain(CredentialError("list a/b/: storage refused the credentials (HTTP 403)"))
    assert refused.startswith("list a/b/: storage refused the credentials (HTTP 403): ")
    assert "SAS" in refused
    assert "Storage Blob Data Reader" in refused
    missing = explain(ContainerNotFound("list a/b/: container not found (HTTP 404)"))
    assert "check the container name" in missing


def test_an_error_with_nothing_underneath_keeps_its_message() -> None:
    assert explain(StorageError("list a/b/ failed (HTTP 400)")) == "list a/b/ failed (HTTP 400)"


def test_endpoint_of_an_account_url() -> None:
    assert endpoint_of("http://127.0.0.1:10000/devstoreaccount1") == "127.0.0.1:10000"
    assert endpoint_of("https://acct.blob.core.windows.net") == "acct.blob.core.windows.net"
    assert endpoint_of(None) is None
