"""resolve_access: every branch of the credential order, and that secrets never leak.

No token is ever requested: DefaultAzureCredential is only constructed, then closed.
"""

import asyncio
import base64

import pytest
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

from blobmount.errors import ConfigError, CredentialError
from blobmount.source import SourceSpec
from blobmount.storage._aio_bridge import AsyncioBridge
from blobmount.storage.azure import AzureStorageClient
from blobmount.storage.azure_auth import (
    DEV_KEY,
    AzureAccess,
    build_storage_client,
    resolve_access,
)

KEY = base64.b64encode(b"k" * 64).decode()
OTHER_KEY = base64.b64encode(b"o" * 64).decode()
SAS = "sv=2024-08-04&ss=b&srt=co&sp=rl&se=2031-01-01T00%3A00%3A00Z&sig=SECRETSIGNATURE%3D"

AZ = SourceSpec(scheme="az", container="data", prefix="train/")
HTTPS = SourceSpec(
    scheme="https",
    container="data",
    account="acct",
    account_url="https://acct.blob.core.windows.net",
)
AZURITE = SourceSpec(
    scheme="http",
    container="data",
    account="devstoreaccount1",
    account_url="http://127.0.0.1:10000/devstoreaccount1",
)


def cs(**fields):
    return ";".join(f"{k}={v}" for k, v in fields.items())


def assert_no_secret(obj, *secrets):
    text = f"{obj!r} {obj!s}"
    for secret in secrets:
        assert secret not in text


# -- (a) connection string ---------------------------------------------------------------


def test_connection_string_with_key_for_az_uri():
    env = {
        "AZURE_STORAGE_CONNECTION_STRING": cs(
            DefaultEndpointsProtocol="https",
            AccountName="acct",
            AccountKey=KEY,
            EndpointSuffix="core.windows.net",
        )
    }
    access = resolve_access(AZ, env)
    assert access.account == "acct"
    assert access.account_url == "https://acct.blob.core.windows.net"
    assert access.container == "data"
    assert access.method == "connection string"
    assert isinstance(access.credential, AzureNamedKeyCredential)
    assert access.credential.named_key == ("acct", KEY)
    assert_no_secret(access, KEY)


def test_connection_string_blob_endpoint_gives_the_url():
    env = {
        "AZURE_STORAGE_CONNECTION_STRING": cs(
            DefaultEndpointsProtocol="http",
            AccountName="devstoreaccount1",
            AccountKey=DEV_KEY,
            BlobEndpoint="http://127.0.0.1:12345/devstoreaccount1",
        )
        + ";"
    }
    access = resolve_access(AZ, env)
    assert access.account_url == "http://127.0.0.1:12345/devstoreaccount1"
    assert access.account == "devstoreaccount1"


def test_connection_string_endpoint_suffix_and_protocol():
    env = {
        "AZURE_STORAGE_CONNECTION_STRING": cs(
            DefaultEndpointsProtocol="https",
            AccountName="acct",
            AccountKey=KEY,
            EndpointSuffix="core.chinacloudapi.cn",
        )
    }
    assert resolve_access(AZ, env).account_url == "https://acct.blob.core.chinacloudapi.cn"


def test_connection_string_keys_are_case_insensitive_and_values_keep_equals():
    env = {"AZURE_STORAGE_CONNECTION_STRING": f"accountname=acct;ACCOUNTKEY={KEY}"}
    access = resolve_access(AZ, env)
    assert access.credential.named_key == ("acct", KEY)  # KEY ends in '=='


def test_connection_string_with_sas():
    env = {
        "AZURE_STORAGE_CONNECTION_STRING": (
            f"BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature={SAS}"
        )
    }
    access = resolve_access(AZ, env)
    assert access.account == "acct"
    assert access.account_url == "https://acct.blob.core.windows.net"
    assert isinstance(access.credential, AzureSasCredential)
    assert access.credential.signature == SAS
    assert "SAS" in access.method
    assert_no_secret(access, "SECRETSIGNATURE")


def test_connection_string_development_storage():
    env = {"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"}
    access = resolve_access(AZ, env)
    assert access.account == "devstoreaccount1"
    assert access.account_url == "http://127.0.0.1:10000/devstoreaccount1"
    assert access.credential.named_key == ("devstoreaccount1", DEV_KEY)


def test_connection_string_spec_url_wins_over_blob_endpoint():
    env = {
        "AZURE_STORAGE_CONNECTION_STRING": cs(
            AccountName="devstoreaccount1",
            AccountKey=DEV_KEY,
            BlobEndpoint="http://127.0.0.1:9/devstoreaccount1",
        )
    }
    access = resolve_access(AZURITE, env)
    assert access.account_url == "http://127.0.0.1:10000/devstoreaccount1"


def test_connection_string_beats_everything_else():
    env = {
        "AZURE_STORAGE_CONNECTION_STRING": cs(AccountName="acct", AccountKey=KEY),
        "AZURE_STORAGE_KEY": OTHER_KEY,
        "AZURE_STORAGE_SAS_TOKEN": SAS,
        "DATASET_MOUNT_ANONYMOUS": "true",
    }
    access = resolve_access(HTTPS, env, anonymous=True)
    assert access.method == "connection string"
    assert access.credential.named_key == ("acct", KEY)


def test_connection_string_for_another_account_is_refused():
    env = {"AZURE_STORAGE_CONNECTION_STRING": cs(AccountName="other", AccountKey=KEY)}
    with pytest.raises(CredentialError) as info:
        resolve_access(HTTPS, env)
    assert "'acct'" in str(info.value)
    assert "'other'" in str(info.value)
    assert KEY not in str(info.value)


@pytest.mark.parametrize(
    "bad",
    [
        "this is not a connection string",
        f"AccountName=acct;AccountKey={KEY};garbage",
        f"AccountKey={KEY}",  # no account, no endpoint
        "AccountName=acct;AccountKey=not base64 at all!!",
        f"AccountName=acct;AccountKey={KEY};DefaultEndpointsProtocol=ftp",
        f"AccountName=acct;AccountKey={KEY};BlobEndpoint=notaurl",
        ";;;",
    ],
)
def test_malformed_connection_string_names_the_variable_not_the_content(bad):
    with pytest.raises(CredentialError) as info:
        resolve_access(AZ, {"AZURE_STORAGE_CONNECTION_STRING": bad})
    message = str(info.value)
    assert "AZURE_STORAGE_CONNECTION_STRING" in message
    assert KEY not in message
    assert bad not in message


# -- (b) account key ----------------------------------------------------------------------


@pytest.mark.parametrize("var", ["AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY"])
def test_account_key_with_account_from_env(var):
    access = resolve_access(AZ, {"AZURE_STORAGE_ACCOUNT": "acct", var: KEY})
    assert access.method == "account key"
    assert access.account == "acct"
    assert access.account_url == "https://acct.blob.core.windows.net"
    assert access.credential.named_key == ("acct", KEY)
    assert_no_secret(access, KEY)


def test_account_key_with_account_from_spec():
    access = resolve_access(HTTPS, {"AZURE_STORAGE_KEY": KEY})
    assert access.account == "acct"
    assert access.account_url == "https://acct.blob.core.windows.net"
    assert access.credential.named_key == ("acct", KEY)


def test_account_key_with_custom_endpoint_for_az_uri():
    env = {
        "AZURE_STORAGE_KEY": DEV_KEY,
        "AZURE_STORAGE_BLOB_ENDPOINT": "http://127.0.0.1:10000/devstoreaccount1",
    }
    access = resolve_access(AZ, env)
    assert access.account == "devstoreaccount1"
    assert access.account_url == "http://127.0.0.1:10000/devstoreaccount1"


def test_account_key_for_another_account_is_refused():
    env = {"AZURE_STORAGE_ACCOUNT": "other", "AZURE_STORAGE_KEY": KEY}
    with pytest.raises(CredentialError, match=r"'acct'.*'other'"):
        resolve_access(HTTPS, env)


def test_account_key_that_is_not_base64_names_the_variable():
    with pytest.raises(CredentialError, match="AZURE_STORAGE_KEY") as info:
        resolve_access(HTTPS, {"AZURE_STORAGE_KEY": "s3cr3t!!"})
    assert "s3cr3t" not in str(info.value)


def test_key_beats_sas():
    env = {"AZURE_STORAGE_KEY": KEY, "AZURE_STORAGE_SAS_TOKEN": SAS}
    assert resolve_access(HTTPS, env).method == "account key"


# -- (c) SAS ------------------------------------------------------------------------------


def test_sas_from_the_uri():
    spec = SourceSpec(
        scheme="https",
        container="data",
        account="acct",
        account_url="https://acct.blob.core.windows.net",
        sas_token=SAS,
    )
    access = resolve_access(spec, {"AZURE_STORAGE_SAS_TOKEN": "sig=other"})
    assert access.method == "SAS token"
    assert access.credential.signature == SAS
    assert_no_secret(access, "SECRETSIGNATURE")


def test_sas_from_env_with_leading_question_mark():
    env = {"AZURE_STORAGE_ACCOUNT": "acct", "AZURE_STORAGE_SAS_TOKEN": "?" + SAS}
    access = resolve_access(AZ, env)
    assert access.method == "SAS token"
    assert access.credential.signature == SAS
    assert access.account_url == "https://acct.blob.core.windows.net"


# -- (d) anonymous on request ------------------------------------------------------------


def test_anonymous_argument():
    access = resolve_access(HTTPS, {}, anonymous=True)
    assert access.method == "anonymous"
    assert access.credential is None


@pytest.mark.parametrize("value", ["true", "1", "YES", "on"])
def test_anonymous_from_env(value):
    access = resolve_access(HTTPS, {"DATASET_MOUNT_ANONYMOUS": value})
    assert access.method == "anonymous"


def test_anonymous_env_bad_value_is_a_config_error():
    with pytest.raises(ConfigError, match="DATASET_MOUNT_ANONYMOUS"):
        resolve_access(HTTPS, {"DATASET_MOUNT_ANONYMOUS": "maybe"})


def test_sas_beats_anonymous():
    env = {"AZURE_STORAGE_SAS_TOKEN": SAS, "DATASET_MOUNT_ANONYMOUS": "true"}
    assert resolve_access(HTTPS, env, anonymous=True).method == "SAS token"


# -- (e) Azure AD, (f) plain http ---------------------------------------------------------


def test_https_with_nothing_else_uses_default_azure_credential():
    from azure.identity.aio import DefaultAzureCredential

    access = resolve_access(HTTPS, {"DATASET_MOUNT_ANONYMOUS": "false"})
    try:
        assert access.method == "Azure AD (DefaultAzureCredential)"
        assert isinstance(access.credential, DefaultAzureCredential)
        assert "credential=<hidden>" in repr(access)
    finally:
        asyncio.run(access.credential.close())  # constructed only: no token was requested


def test_az_uri_with_account_only_uses_azure_ad():
    access = resolve_access(AZ, {"AZURE_STORAGE_ACCOUNT": "acct"})
    try:
        assert access.method.startswith("Azure AD")
        assert access.account_url == "https://acct.blob.core.windows.net"
    finally:
        asyncio.run(access.credential.close())


def test_plain_http_with_nothing_else_is_anonymous():
    access = resolve_access(AZURITE, {})
    assert access.credential is None
    assert access.method.startswith("anonymous")
    assert access.account == "devstoreaccount1"


def test_path_style_url_without_explicit_account():
    spec = SourceSpec(
        scheme="http", container="data", account_url="http://localhost:10000/devstoreaccount1"
    )
    assert resolve_access(spec, {}).account == "devstoreaccount1"


# -- no account anywhere ------------------------------------------------------------------


@pytest.mark.parametrize("env", [{}, {"AZURE_STORAGE_KEY": KEY}, {"AZURE_STORAGE_SAS_TOKEN": SAS}])
def test_az_uri_without_any_account_says_what_to_set(env):
    with pytest.raises(CredentialError) as info:
        resolve_access(AZ, env)
    message = str(info.value)
    for var in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT"):
        assert var in message
    assert_no_secret(info.value, KEY, "SECRETSIGNATURE")


# -- AzureAccess and build_storage_client -------------------------------------------------


def test_repr_hides_the_credential():
    access = AzureAccess("https://a.blob.core.windows.net", "a", "c", {"key": KEY}, "account key")
    assert KEY not in repr(access)
    assert "account key" in repr(access)


async def test_build_storage_client_uses_the_bridge_and_names_the_location():
    with AsyncioBridge() as bridge:
        access = resolve_access(HTTPS, {"AZURE_STORAGE_KEY": KEY})
        client = build_storage_client(
            access, bridge, connect_timeout_s=1.0, read_timeout_s=2.0, max_connections=8
        )
        try:
            assert isinstance(client, AzureStorageClient)
            assert client.bridge is bridge
            assert client.location == "acct/data"
        finally:
            await client.aclose()  # never used: nothing was opened, no request made
