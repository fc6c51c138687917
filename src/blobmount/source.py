"""Source URIs → SourceSpec. Pure: no network, no environment.

Accepted forms (see docs/CONFIGURATION.md):
    az://<container>[/<prefix>]
    https://<account>.blob.core.windows.net/<container>[/<prefix>][?<sas>]
    http(s)://<host>[:port]/<account>/<container>[/<prefix>][?<sas>]     (path-style: Azurite)
    wasbs://<container>@<account>.blob.core.windows.net[/<prefix>]

Azure ML datastore URIs (azureml://) are recognised and refused for now: resolving them needs the
datastores file, which is planned. Errors echo the URI with secrets masked (`redact_uri`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from blobmount.errors import SourceError

__all__ = ["SourceSpec", "parse_source", "redact_uri"]


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """Where the data is. `prefix` is '' or ends with '/'.

    `account_url` is the service endpoint including the account for path-style hosts
    (e.g. 'https://acct.blob.core.windows.net' or 'http://127.0.0.1:10000/devstoreaccount1');
    None for az:// (the credentials decide). `sas_token` is a SAS found in the URI's query
    (a secret: never log it; use `display`).
    """

    scheme: str
    container: str
    prefix: str = ""
    account: str | None = None
    account_url: str | None = None
    sas_token: str | None = None

    @property
    def display(self) -> str:
        """The URI without secrets, for logs and messages."""
        base = self.account_url or f"{self.scheme}://"
        sep = "/" if self.account_url else ""
        return f"{base}{sep}{self.container}/{self.prefix}".rstrip("/")

    def __repr__(self) -> str:
        # The generated repr would print the SAS into tracebacks and %r log lines.
        sas = "'***'" if self.sas_token else "None"
        return (
            f"SourceSpec(scheme={self.scheme!r}, container={self.container!r}, "
            f"prefix={self.prefix!r}, account={self.account!r}, "
            f"account_url={self.account_url!r}, sas_token={sas})"
        )


_FORMS = (
    "az://<container>[/<prefix>], "
    "https://<account>.blob.core.windows.net/<container>[/<prefix>][?<sas>], "
    "http(s)://<host>[:<port>]/<account>/<container>[/<prefix>] (path-style, e.g. Azurite) or "
    "wasbs://<container>@<account>.blob.core.windows.net[/<prefix>]"
)

_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")

# `<account>.blob.<suffix>`, also the DNS-zone form `<account>.z<NN>.blob.storage.azure.net`.
_BLOB_HOST_RE = re.compile(r"(?P<account>[^.]+)\.(?:z\d+\.)?blob\.[^.].*")
_DFS_HOST_RE = re.compile(r"[^.]+\.(?:z\d+\.)?dfs\.[^.].*")

# Azure: 3-24 lowercase letters and digits; the read-only secondary endpoint adds "-secondary".
_ACCOUNT_RE = re.compile(r"[a-z0-9]{3,24}(?:-secondary)?")
# Path-style hosts (Azurite, proxies) name accounts more freely; still keep them URL-safe.
_PATH_ACCOUNT_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})")
# 3-63 of lowercase letters, digits and single hyphens, starting and ending alphanumeric;
# plus the special containers Azure creates itself.
_CONTAINER_RE = re.compile(r"\$root|\$web|\$logs|[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")

# Azure's limit on a blob name, and so on any prefix of one.
_MAX_BLOB_NAME = 1024

_SIG_RE = re.compile(r"(sig=)[^&#]*", re.IGNORECASE)
_PASSWORD_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/?#:@]*):[^/?#@]*@")


def redact_uri(uri: str) -> str:
    """`uri` with the SAS signature and any password replaced by ``***``, for messages."""
    return _PASSWORD_RE.sub(r"\1:***@", _SIG_RE.sub(r"\1***", uri))


def _error(uri: str, problem: str) -> SourceError:
    return SourceError(f"invalid source URI {redact_uri(uri)!r}: {problem}")


def parse_source(uri: str) -> SourceSpec:
    """Parse a source URI (forms in the module docstring) into a `SourceSpec`.

    The prefix is percent-decoded and normalised to '' or 'a/b/'. Surrounding whitespace is
    ignored.

    Raises:
        SourceError: the URI is malformed, names an invalid container or account, or uses an
            unsupported form; the message echoes the URI with any SAS signature masked.
    """
    text = uri.strip()
    if not text:
        raise SourceError(f"the source URI is empty; expected {_FORMS}")
    match = _SCHEME_RE.match(text)
    if match is None:
        raise _error(uri, f"not a URI; expected {_FORMS}")
    scheme = match[1].lower()
    if scheme == "azureml":
        raise _error(
            uri,
            "Azure ML datastore URIs (azureml://) are not supported yet (planned); use "
            "az://, https:// or wasbs:// with the datastore's account and container",
        )
    if scheme not in {"az", "http", "https", "wasb", "wasbs"}:
        raise _error(uri, f"unsupported scheme {scheme + '://'!r}; expected {_FORMS}")
    try:
        parts = urlsplit(text)
    except ValueError as exc:  # e.g. an unbalanced '[' in the host
        raise _error(uri, f"cannot parse it ({exc})") from None
    if "#" in text:
        raise _error(uri, "it has a '#' fragment; write '#' in a blob name as %23")

    sas_token: str | None = None
    if parts.query:
        if scheme not in {"http", "https"}:
            raise _error(
                uri, f"a query string is only accepted on http(s) URIs (for a SAS), not {scheme}://"
            )
        sas_token = _sas_token(uri, parts.query)

    if scheme == "az":
        container, prefix = _parse_az(uri, parts)
        return SourceSpec(scheme=scheme, container=container, prefix=prefix)
    if scheme in {"wasb", "wasbs"}:
        return _parse_wasb(uri, scheme, parts)
    return _parse_http(uri, scheme, parts, sas_token)


def _sas_token(uri: str, query: str) -> str:
    keys = {key.lower(): value for key, value in parse_qsl(query, keep_blank_values=True)}
    if "sig" not in keys:
        raise _error(uri, "unexpected query string: only a SAS token (with sig=...) is accepted")
    if not keys["sig"]:
        raise _error(uri, "the SAS token in the query has an empty sig")
    return query


def _parse_az(uri: str, parts: SplitResult) -> tuple[str, str]:
    if not parts.netloc:
        raise _error(uri, "no container: expected az://<container>[/<prefix>]")
    if "@" in parts.netloc or ":" in parts.netloc:
        raise _error(
            uri,
            "az:// takes a container name, not a host; the account comes from the credentials "
            "(use https:// or wasbs:// to name it)",
        )
    container = _container(uri, unquote(parts.netloc))
    return container, _prefix(uri, parts.path.removeprefix("/"))


def _parse_wasb(uri: str, scheme: str, parts: SplitResult) -> SourceSpec:
    if "@" not in parts.netloc:
        raise _error(
            uri,
            f"no container: expected {scheme}://<container>@<account>.blob.core.windows.net"
            "[/<prefix>]",
        )
    container_raw, _, hostport = parts.netloc.partition("@")
    container = _container(uri, unquote(container_raw))
    host = _host(uri, parts)
    host_match = _BLOB_HOST_RE.fullmatch(host)
    if host_match is None:
        raise _error(uri, f"the host {host!r} is not of the form <account>.blob.<endpoint suffix>")
    account = _account(uri, host_match["account"])
    http_scheme = "https" if scheme == "wasbs" else "http"
    return SourceSpec(
        scheme=scheme,
        container=container,
        prefix=_prefix(uri, parts.path.removeprefix("/")),
        account=account,
        account_url=f"{http_scheme}://{hostport.lower()}",
    )


def _parse_http(uri: str, scheme: str, parts: SplitResult, sas_token: str | None) -> SourceSpec:
    if "@" in parts.netloc:
        raise _error(
            uri,
            "user names and passwords in the URI are not supported; put a SAS in the query or "
            "use the AZURE_STORAGE_* variables",
        )
    host = _host(uri, parts)
    if _DFS_HOST_RE.fullmatch(host):
        raise _error(
            uri, "Data Lake (dfs) endpoints are not supported; use the blob endpoint instead"
        )
    authority = parts.netloc.lower()
    path = parts.path
    host_match = _BLOB_HOST_RE.fullmatch(host)
    if host_match is not None:
        account = _account(uri, host_match["account"])
        account_url = f"{scheme}://{authority}"
    else:
        # Path-style: the first path segment is the account (Azurite, emulators, proxies).
        account_raw, _, rest = path.removeprefix("/").partition("/")
        account = unquote(account_raw)
        if not account:
            raise _error(
                uri, "no account: a path-style URI is http(s)://<host>/<account>/<container>"
            )
        if not _PATH_ACCOUNT_RE.fullmatch(account):
            raise _error(
                uri,
                f"account name {account!r} is not valid: expected letters, digits and hyphens",
            )
        account_url = f"{scheme}://{authority}/{account}"
        path = "/" + rest
    container_raw, _, rest = path.removeprefix("/").partition("/")
    container = _container(uri, unquote(container_raw))
    return SourceSpec(
        scheme=scheme,
        container=container,
        prefix=_prefix(uri, rest),
        account=account,
        account_url=account_url,
        sas_token=sas_token,
    )


def _host(uri: str, parts: SplitResult) -> str:
    try:
        parts.port  # noqa: B018  (urlsplit checks the port only when it is read)
    except ValueError:
        raise _error(uri, "the port is not a number between 0 and 65535") from None
    host = parts.hostname
    if not host:
        raise _error(uri, "no host")
    return host


def _account(uri: str, label: str) -> str:
    """The account named by a host's first label."""
    if not _ACCOUNT_RE.fullmatch(label):
        raise _error(
            uri,
            f"storage account name {label!r} is not valid: Azure account names are 3-24 "
            "lowercase letters and digits",
        )
    # acct-secondary.blob... is the read-only replica of account "acct"; shared-key signing
    # and credential checks need the account's own name.
    return label.removesuffix("-secondary")


def _container(uri: str, name: str) -> str:
    if not name:
        raise _error(uri, f"no container; expected {_FORMS}")
    if not _CONTAINER_RE.fullmatch(name):
        raise _error(
            uri,
            f"container name {name!r} is not valid: Azure container names are 3-63 lowercase "
            "letters, digits and single hyphens, starting and ending with a letter or digit",
        )
    return name


def _prefix(uri: str, raw: str) -> str:
    """Percent-decode and check what follows the container's '/'; return '' or 'a/b/'."""
    decoded = unquote(raw)
    if not decoded:
        return ""
    segments = decoded.split("/")
    if segments[-1] == "":
        segments.pop()  # one trailing '/' is the folder spelling of the same prefix
    for segment in segments:
        if segment == "":
            raise _error(uri, "the prefix has an empty path segment ('//')")
        if segment in {".", ".."}:
            raise _error(uri, f"the prefix has a {segment!r} segment; name the folder directly")
    prefix = "/".join(segments) + "/"
    if len(prefix) > _MAX_BLOB_NAME:
        raise _error(uri, f"the prefix is longer than {_MAX_BLOB_NAME} characters")
    return prefix
