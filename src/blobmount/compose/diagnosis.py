"""Why the first request to storage failed, in words a user can act on.

A storage client's error names the request it made ("list acct/container/prefix/") and the kind
of failure ("connection failed"); the exceptions underneath it say more: the host that did not
resolve, the port that refused, the TLS check that failed, each credential that could not give a
token. `explain` adds that, and what to do about it, to the error's message. It reads the
exceptions by their standard-library types and attributes only (HTTP and azure are confined
to storage/), and copies no library text but azure-identity's per-credential reasons, which
go through the log redaction with every URL shown as <url>: no secret reaches the message.
"""

from __future__ import annotations

import re
import socket
import ssl
from urllib.parse import urlsplit

from blobmount.errors import ContainerNotFound, CredentialError, StorageError
from blobmount.logs import redact

#: how deep to follow an exception's causes
_MAX_CAUSES = 12
#: the longest reason quoted for one credential of a credential chain
_MAX_REASON = 90
#: a URL in a library's message: shown as <url>, since its query may carry a secret
_URL = re.compile(r"https?://\S+")

_TOKEN_ADVICE = (
    "sign in (az login, a managed identity, or AZURE_CLIENT_ID/AZURE_TENANT_ID with a secret "
    "or certificate), or give AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_KEY or "
    "AZURE_STORAGE_SAS_TOKEN (--anonymous for a public container)"
)
_REFUSED_ADVICE = (
    "check the account key, connection string or SAS (its expiry, and read and list "
    "permissions), or the identity's role on the container (Storage Blob Data Reader)"
)


def causes(exc: BaseException) -> list[BaseException]:
    """`exc` and what lies under it: aiohttp's `os_error` (under the SDK), azure-core's
    `inner_exception`, then the explicit or implicit cause (a storage client raises its own
    error `from None`, which hides the original from tracebacks but keeps it as
    `__context__`)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < _MAX_CAUSES:
        chain.append(current)
        below: object = None
        for attr in ("os_error", "inner_exception"):
            below = getattr(current, attr, None)
            if isinstance(below, BaseException):
                break
        if not isinstance(below, BaseException):
            below = current.__cause__ or current.__context__
        current = below if isinstance(below, BaseException) else None
    return chain


def endpoint_of(account_url: str | None) -> str | None:
    """The host:port (or host) of an account URL, for `explain`; None without one."""
    if not account_url:
        return None
    parts = urlsplit(account_url)
    if not parts.hostname:
        return None
    return f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname


def _endpoint(chain: list[BaseException]) -> str | None:
    """host:port of the connection that failed, when an exception of the chain names it."""
    for exc in chain:
        host, port = getattr(exc, "host", None), getattr(exc, "port", None)
        if isinstance(host, str) and host:
            return f"{host}:{port}" if isinstance(port, int) else host
    return None


def _host(chain: list[BaseException]) -> str | None:
    for exc in chain:
        host = getattr(exc, "host", None)
        if isinstance(host, str) and host:
            return host
    return None


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _network(chain: list[BaseException], endpoint_hint: str | None) -> str | None:
    """What failed on the way to storage, and what to check; None when nothing network-like
    is in the chain."""
    endpoint = _endpoint(chain) or endpoint_hint or "the storage endpoint"
    host = _host(chain) or (endpoint_hint or "").rpartition(":")[0] or endpoint
    for exc in chain:
        if isinstance(exc, socket.gaierror):
            return (
                f"the host name {host} does not resolve ({_reason(exc)}); check the account "
                "name or endpoint in the URI, and this machine's DNS"
            )
    names = {type(exc).__name__ for exc in chain}
    if any("Proxy" in name for name in names):
        return (
            f"could not connect through the proxy {endpoint}; check HTTPS_PROXY, HTTP_PROXY "
            "and NO_PROXY"
        )
    tls = [exc for exc in chain if isinstance(exc, ssl.SSLError)]
    if tls:
        # the ssl module's own error carries the reason; a wrapper of it may not
        reasons = [getattr(e, "verify_message", None) or getattr(e, "reason", None) for e in tls]
        why = next((r for r in reasons if r), None)
        if any(isinstance(exc, ssl.SSLCertVerificationError) for exc in tls):
            return (
                f"the TLS certificate of {host} was not accepted ({why or 'not trusted'}); "
                "check the endpoint, and the system's CA certificates"
            )
        return (
            f"the TLS handshake with {endpoint} failed ({why or 'TLS error'}); check that the "
            "endpoint speaks HTTPS (http:// for an emulator)"
        )
    for exc in chain:
        if isinstance(exc, ConnectionRefusedError):
            return (
                f"{endpoint} refused the connection (nothing listens there); check the "
                "endpoint's host and port, and that the service is running"
            )
        if isinstance(exc, TimeoutError):
            return (
                f"{endpoint} did not answer in time; check the network path to it (a "
                "firewall, HTTPS_PROXY / NO_PROXY), or raise "
                "DATASET_MOUNT_CONNECT_TIMEOUT_SECONDS / DATASET_MOUNT_READ_TIMEOUT_SECONDS"
            )
    for exc in chain[1:]:
        if isinstance(exc, OSError) and exc.strerror:
            return f"connecting to {endpoint} failed ({exc.strerror}); check the network"
    return None


def _credential_reasons(text: str) -> list[str]:
    """Each credential of a credential chain's message as Name (reason), from its lines
    "<tab>Name: reason" as azure-identity's DefaultAzureCredential writes them."""
    out = []
    for match in re.finditer(r"^\s+(\w+Credential): (.+)$", text, re.MULTILINE):
        name, reason = match[1], match[2].strip()
        reason = reason.removeprefix(f"{name} ").removeprefix("authentication unavailable. ")
        reason = re.split(r"(?<=[a-z0-9])\.\s", reason, maxsplit=1)[0].rstrip(".")
        reason = _URL.sub("<url>", reason)  # a link, or a URL with a query
        if len(reason) > _MAX_REASON:
            reason = reason[: _MAX_REASON - 3] + "..."
        out.append(f"{name} ({reason})")
    return out


def _token(chain: list[BaseException]) -> str | None:
    """What a token credential said when it gave no token; None if no token was asked for."""
    for exc in chain:
        # storage's own 401/403 is an HTTP status error: these come from a token credential
        if type(exc).__name__ in ("ClientAuthenticationError", "CredentialUnavailableError"):
            text = str(exc)
            tried = _credential_reasons(text)
            if tried:
                what = "the credential chain tried " + ", ".join(tried)
            else:
                first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
                what = _URL.sub("<url>", first)[: _MAX_REASON * 2]
            return redact(f"{what}; {_TOKEN_ADVICE}")
    return None


def explain(exc: StorageError, endpoint: str | None = None) -> str:
    """`exc`'s message with what failed underneath it and what to do, as one line.

    `endpoint` ("host:port") names the endpoint when the exceptions do not (a timeout)."""
    chain = causes(exc)
    detail: str | None
    if isinstance(exc, CredentialError):
        detail = _token(chain) or _REFUSED_ADVICE
    elif isinstance(exc, ContainerNotFound):
        detail = "check the container name, and the account, in the URI"
    else:
        detail = _network(chain, endpoint)
    message = f"{exc}: {detail}" if detail else str(exc)
    return " ".join(message.split())  # one line, whatever the parts held
