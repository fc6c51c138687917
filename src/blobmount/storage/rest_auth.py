"""How each request to Blob Storage proves who it is, for the lean REST client.

`request_auth(credential, account, container)` turns any credential blobmount resolves (see
azure_auth.resolve_access) into a RequestAuth that, per request, returns the SAS query to append
and/or sets an Authorization header:

- None: anonymous, nothing added.
- a SAS (AzureSasCredential or a string): its current signature is appended (an
  AzureSasCredential can be updated while the mount runs).
- an account key (AzureNamedKeyCredential or {"account_name", "account_key"}): a read+list SAS
  for the container is made from the key with the SDK's `generate_container_sas` and renewed
  well before it expires. Signing each request with Shared Key would mean canonicalising
  headers ourselves; the SAS is the SDK's own, public way to use a key, and costs nothing per
  request.
- a token credential (anything with `get_token`, sync or async; azure.identity's): a bearer
  token for Azure Storage, cached until shortly before it expires.

Nothing here logs or formats a secret.
"""

from __future__ import annotations

import asyncio
import datetime
import inspect
import time
from collections.abc import Mapping
from typing import Any, Protocol

from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.storage.blob import ContainerSasPermissions, generate_container_sas

from blobmount.errors import CredentialError

#: the scope Azure AD tokens for Blob Storage are issued for
STORAGE_SCOPE = "https://storage.azure.com/.default"
#: a key-derived SAS is valid this long ...
_KEY_SAS_LIFETIME_S = 6 * 3600.0
#: ... renewed when less than this is left ...
_KEY_SAS_RENEW_S = 3600.0
#: ... and starts this far back, so a storage clock somewhat ahead of ours still accepts it
_KEY_SAS_CLOCK_SKEW_S = 900.0
#: a cached bearer token is renewed when it has less than this left
_TOKEN_RENEW_S = 300.0


class RequestAuth(Protocol):
    """Per-request authorization. Called by the task that sends the request, on trio; a
    `BearerAuth` that must fetch a token is called on the credential's asyncio loop instead
    (the storage client's bridge)."""

    #: a short label for messages ("SAS", "account key", ...), never a secret
    label: str

    async def authorize(self, headers: dict[str, str]) -> str:
        """Set any auth header in `headers`; return the query to append ("" for none)."""
        ...


class AnonymousAuth:
    label = "anonymous"

    async def authorize(self, headers: dict[str, str]) -> str:
        return ""


class SasAuth:
    """A SAS given by the user; read at every request so an updated credential takes effect."""

    label = "SAS"

    def __init__(self, sas: AzureSasCredential | str) -> None:
        self._sas = sas

    async def authorize(self, headers: dict[str, str]) -> str:
        sas = self._sas.signature if isinstance(self._sas, AzureSasCredential) else self._sas
        return sas.lstrip("?")


class KeySasAuth:
    """A container SAS (read, list) signed with the account key, renewed before it expires."""

    label = "account key"

    def __init__(self, account: str, key: str, container: str) -> None:
        self._account = account
        self._key = key
        self._container = container
        self._sas = ""
        self._renew_at = 0.0

    def _make(self, now: float) -> str:
        utc = datetime.UTC
        try:
            return generate_container_sas(
                self._account,
                self._container,
                account_key=self._key,
                permission=ContainerSasPermissions(read=True, list=True),
                start=datetime.datetime.fromtimestamp(now - _KEY_SAS_CLOCK_SKEW_S, utc),
                expiry=datetime.datetime.fromtimestamp(now + _KEY_SAS_LIFETIME_S, utc),
            )
        except (ValueError, TypeError) as exc:
            # the SDK rejects a key that is not base64; say so without repeating it
            raise CredentialError(
                f"the account key for {self._account!r} cannot sign requests ({type(exc).__name__})"
            ) from None

    async def authorize(self, headers: dict[str, str]) -> str:
        now = time.time()
        if now >= self._renew_at:
            self._sas = self._make(now)
            self._renew_at = now + _KEY_SAS_LIFETIME_S - _KEY_SAS_RENEW_S
        return self._sas


class BearerAuth:
    """An Azure AD token from a token credential, cached until shortly before it expires."""

    label = "Azure AD token"

    def __init__(self, credential: Any) -> None:
        self._credential = credential
        self._token = ""
        self._expires_on = 0.0
        # one token request at a time: a burst of GETs at start must not ask 64 times
        self._lock: asyncio.Lock | None = None

    async def _fetch(self) -> None:
        got = self._credential.get_token(STORAGE_SCOPE)
        if inspect.isawaitable(got):
            got = await got
        self._token = got.token
        self._expires_on = float(got.expires_on)

    def apply_cached(self, headers: dict[str, str]) -> bool:
        """Set the Authorization header from the cached token if it is good for a while yet;
        False when `authorize` must fetch one (on the credential's event loop)."""
        if time.time() >= self._expires_on - _TOKEN_RENEW_S:
            return False
        headers["Authorization"] = f"Bearer {self._token}"
        return True

    async def authorize(self, headers: dict[str, str]) -> str:
        if time.time() >= self._expires_on - _TOKEN_RENEW_S:
            if self._lock is None:
                self._lock = asyncio.Lock()  # made on the loop that uses it
            async with self._lock:
                if time.time() >= self._expires_on - _TOKEN_RENEW_S:
                    await self._fetch()
        headers["Authorization"] = f"Bearer {self._token}"
        return ""


def request_auth(credential: object, account: str, container: str) -> RequestAuth:
    """The RequestAuth for a credential of any type blobmount resolves (see module docstring)."""
    if credential is None:
        return AnonymousAuth()
    if isinstance(credential, AzureSasCredential | str):
        return SasAuth(credential)
    if isinstance(credential, AzureNamedKeyCredential):
        name, key = credential.named_key
        return KeySasAuth(name, key, container)
    if isinstance(credential, Mapping) and {"account_name", "account_key"} <= credential.keys():
        name, key = str(credential["account_name"]), str(credential["account_key"])
        return KeySasAuth(name, key, container)
    if callable(getattr(credential, "get_token", None)):
        return BearerAuth(credential)
    raise CredentialError(
        f"unsupported credential type {type(credential).__name__} for account {account!r}"
    )
