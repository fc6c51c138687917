"""Which endpoint and which credential to use for a source: resolve_access().

Order, first that applies (see docs/CONFIGURATION.md):

1. AZURE_STORAGE_CONNECTION_STRING
2. an account key: AZURE_STORAGE_KEY (alias AZURE_STORAGE_ACCOUNT_KEY)
3. a SAS: from the source URI, else AZURE_STORAGE_SAS_TOKEN
4. anonymous, when asked for (argument, or DATASET_MOUNT_ANONYMOUS=true)
5. Azure AD via azure.identity.aio.DefaultAzureCredential, for https endpoints
6. anonymous, for plain-http endpoints (emulators) with nothing else

For an azureml:// source the datastore's credential reference (from the datastores file, see
blobmount.datastores) is used instead of this order.

Secrets never appear in messages or reprs: AzureAccess shows a label ("account key"), never the
credential, and errors about a bad connection string name the variable, not its content.
Resolving makes no network request (DefaultAzureCredential only asks for a token when used).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

from blobmount.datastores import credential_secret
from blobmount.errors import ConfigError, CredentialError
from blobmount.source import CredentialRef, SourceSpec
from blobmount.storage._aio_bridge import AsyncioBridge
from blobmount.storage.azure import AzureStorageClient, account_name_from_url

CONNECTION_STRING_VAR = "AZURE_STORAGE_CONNECTION_STRING"
KEY_VARS = ("AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY")
ACCOUNT_VAR = "AZURE_STORAGE_ACCOUNT"
SAS_VAR = "AZURE_STORAGE_SAS_TOKEN"
ENDPOINT_VAR = "AZURE_STORAGE_BLOB_ENDPOINT"
ANONYMOUS_VAR = "DATASET_MOUNT_ANONYMOUS"

#: the Azurite / storage-emulator account (public, documented by Microsoft)
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
DEV_BLOB_ENDPOINT = f"http://127.0.0.1:10000/{DEV_ACCOUNT}"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


@dataclass(frozen=True, repr=False)
class AzureAccess:
    """Everything needed to talk to one container. `method` is a label, never a secret."""

    account_url: str
    account: str
    container: str
    credential: object = field(compare=False)
    method: str

    def __repr__(self) -> str:
        return (
            f"AzureAccess(account_url={self.account_url!r}, account={self.account!r}, "
            f"container={self.container!r}, method={self.method!r}, credential=<hidden>)"
        )


# -- helpers -------------------------------------------------------------------------------


def _env_bool(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; use true/false (or 1/0, yes/no, on/off)")


def _check_key(key: str, source: str) -> str:
    """An account key must be base64; say which setting is wrong, never what it holds."""
    key = key.strip()
    try:
        if not key or not base64.b64decode(key, validate=True):
            raise ValueError
    except (binascii.Error, ValueError):
        raise CredentialError(f"{source}: the account key is not valid base64") from None
    return key


def _check_url(url: str, what: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CredentialError(f"{what} must be an http(s) URL")
    if parts.query:
        # a SAS belongs in the credential, not in the endpoint we log
        raise CredentialError(f"{what} must not contain a query string")
    return url.rstrip("/")


def _spec_account(spec: SourceSpec) -> str | None:
    if spec.account:
        return spec.account
    if spec.account_url:
        return account_name_from_url(spec.account_url)
    return None


def _mismatch(spec: SourceSpec, spec_account: str, other: str, where: str) -> CredentialError:
    return CredentialError(
        f"the source {spec.display} names storage account {spec_account!r} but {where} is for "
        f"account {other!r}; use credentials for {spec_account!r} or a source in {other!r}"
    )


def _parse_connection_string(raw: str, var: str = CONNECTION_STRING_VAR) -> dict[str, str]:
    """Key=Value;... into a dict with lower-cased keys. Values may contain '=' (base64, SAS)."""
    fields: dict[str, str] = {}
    for segment in raw.split(";"):
        segment = segment.strip()
        if not segment:
            continue
        key, sep, value = segment.partition("=")
        if not sep or not key.strip():
            raise CredentialError(f"{var} is malformed: expected Key=Value pairs separated by ';'")
        fields[key.strip().lower()] = value.strip()
    if not fields:
        raise CredentialError(f"{var} is empty")
    return fields


def _from_connection_string(
    spec: SourceSpec, raw: str, var: str = CONNECTION_STRING_VAR
) -> AzureAccess:
    cs = _parse_connection_string(raw, var)
    if cs.get("usedevelopmentstorage", "").lower() == "true":
        cs.setdefault("accountname", DEV_ACCOUNT)
        cs.setdefault("accountkey", DEV_KEY)
        cs.setdefault("blobendpoint", DEV_BLOB_ENDPOINT)

    endpoint = cs.get("blobendpoint")
    if endpoint:
        endpoint = _check_url(endpoint, f"BlobEndpoint in {var}")
    account = cs.get("accountname") or (account_name_from_url(endpoint) if endpoint else None)
    if not account:
        raise CredentialError(f"{var} is malformed: it has neither AccountName nor BlobEndpoint")
    if not endpoint:
        protocol = cs.get("defaultendpointsprotocol", "https").lower()
        if protocol not in ("http", "https"):
            raise CredentialError(
                f"{var} is malformed: DefaultEndpointsProtocol must be http or https"
            )
        suffix = cs.get("endpointsuffix", "core.windows.net").strip(".")
        endpoint = f"{protocol}://{account}.blob.{suffix}"

    spec_account = _spec_account(spec)
    if spec_account and spec_account != account:
        raise _mismatch(spec, spec_account, account, var)

    account_url = spec.account_url.rstrip("/") if spec.account_url else endpoint
    credential: object
    if cs.get("accountkey"):
        key = _check_key(cs["accountkey"], f"AccountKey in {var}")
        credential, method = AzureNamedKeyCredential(account, key), "connection string"
    elif cs.get("sharedaccesssignature"):
        sas = cs["sharedaccesssignature"].lstrip("?")
        credential, method = AzureSasCredential(sas), "connection string (SAS token)"
    else:
        credential, method = None, "connection string (anonymous)"
    return AzureAccess(account_url, account, spec.container, credential, method)


def _account_and_endpoint(spec: SourceSpec, env: Mapping[str, str]) -> tuple[str, str]:
    """(account, account_url) without a connection string."""
    env_account = env.get(ACCOUNT_VAR, "").strip() or None
    if spec.account_url:
        # the URI names the account; AZURE_STORAGE_ACCOUNT only fills in for az://
        url = spec.account_url.rstrip("/")
        return spec.account or account_name_from_url(url), url
    endpoint = env.get(ENDPOINT_VAR, "").strip()
    if endpoint:
        url = _check_url(endpoint, ENDPOINT_VAR)
        return spec.account or env_account or account_name_from_url(url), url
    account = spec.account or env_account
    if not account:
        raise CredentialError(
            f"{spec.display} does not say which storage account to use: set "
            f"{CONNECTION_STRING_VAR}, or {ACCOUNT_VAR} (with {KEY_VARS[0]}, {SAS_VAR} or an "
            f"Azure AD identity), or {ENDPOINT_VAR}; or give an https:// source URI"
        )
    return account, f"https://{account}.blob.core.windows.net"


# -- public --------------------------------------------------------------------------------


def _from_datastore(spec: SourceSpec, ref: CredentialRef, env: Mapping[str, str]) -> AzureAccess:
    """Access for an azureml:// source: the datastore's credential reference decides alone."""
    assert spec.account is not None  # resolve_datastore always sets it
    secret = credential_secret(ref, env)
    if ref.kind == "connection_string_env":
        assert secret is not None
        assert ref.reference is not None
        access = _from_connection_string(spec, secret, f"{ref.reference} ({ref.origin})")
        return dataclasses.replace(access, method=f"{access.method} from ${ref.reference}")
    account = spec.account
    account_url = (spec.account_url or f"https://{account}.blob.core.windows.net").rstrip("/")
    credential: object = None
    if ref.kind in ("account_key_env", "account_key_file"):
        assert secret is not None
        credential = AzureNamedKeyCredential(account, _check_key(secret, ref.origin))
    elif ref.kind in ("sas_token_env", "sas_token"):
        assert secret is not None
        credential = AzureSasCredential(secret.lstrip("?"))
    elif ref.kind == "azure_ad":
        # lazy: azure.identity is heavy and only Azure AD credentials need it
        from azure.identity.aio import DefaultAzureCredential

        credential = DefaultAzureCredential()
    return AzureAccess(account_url, account, spec.container, credential, ref.label)


def resolve_access(
    spec: SourceSpec, env: Mapping[str, str], *, anonymous: bool = False
) -> AzureAccess:
    """Decide endpoint and credential for `spec` from `env` (see the module docstring).

    An azureml:// source carries its datastore's credential reference (`spec.credential`),
    which wins over every rule of the order: the datastore says how to authenticate.
    """
    if spec.credential is not None:
        return _from_datastore(spec, spec.credential, env)
    raw_cs = env.get(CONNECTION_STRING_VAR, "")
    if raw_cs.strip():
        return _from_connection_string(spec, raw_cs)

    account, account_url = _account_and_endpoint(spec, env)

    for var in KEY_VARS:
        if env.get(var, "").strip():
            key = _check_key(env[var], var)
            spec_account = _spec_account(spec)
            env_account = env.get(ACCOUNT_VAR, "").strip()
            if spec_account and env_account and spec_account != env_account:
                raise _mismatch(spec, spec_account, env_account, f"{var} ({ACCOUNT_VAR})")
            named = AzureNamedKeyCredential(account, key)
            return AzureAccess(account_url, account, spec.container, named, "account key")

    sas = spec.sas_token or env.get(SAS_VAR, "").strip()
    if sas:
        sas_credential = AzureSasCredential(sas.lstrip("?"))
        return AzureAccess(account_url, account, spec.container, sas_credential, "SAS token")

    if anonymous or _env_bool(env, ANONYMOUS_VAR):
        return AzureAccess(account_url, account, spec.container, None, "anonymous")

    if urlsplit(account_url).scheme == "https":
        # lazy: azure.identity is heavy and only this branch needs it
        from azure.identity.aio import DefaultAzureCredential

        return AzureAccess(
            account_url,
            account,
            spec.container,
            DefaultAzureCredential(),
            "Azure AD (DefaultAzureCredential)",
        )
    return AzureAccess(account_url, account, spec.container, None, "anonymous (http endpoint)")


def build_storage_client(
    access: AzureAccess,
    bridge: AsyncioBridge,
    *,
    connect_timeout_s: float = 10.0,
    read_timeout_s: float = 30.0,
    max_connections: int = 64,
) -> AzureStorageClient:
    """An AzureStorageClient for `access` running on `bridge` (which the caller owns).

    The client takes over `access.credential`: its aclose() closes a token credential too.
    """
    return AzureStorageClient(
        access.account_url,
        access.container,
        access.credential,
        bridge=bridge,
        account=access.account,
        connect_timeout_s=connect_timeout_s,
        read_timeout_s=read_timeout_s,
        max_connections=max_connections,
    )
