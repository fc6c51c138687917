"""Source URIs → SourceSpec. Pure: no network, no environment.

Accepted forms (see docs/CONFIGURATION.md):
    az://<container>[/<prefix>]
    https://<account>.blob.core.windows.net/<container>[/<prefix>][?<sas>]
    http(s)://<host>[:port]/<account>/<container>[/<prefix>][?<sas>]     (path-style: Azurite)
    wasbs://<container>@<account>.blob.core.windows.net[/<prefix>]
    azureml://datastores/<name>/paths/<prefix>
    azureml://subscriptions/<sub>/resourcegroups/<rg>/workspaces/<ws>/datastores/<name>/paths/<prefix>
    synthetic://<name>[/<prefix>][?small_files=..&small_size=..&per_folder=..&large_files=..
        &large_size=..&seed=..]                      (made-up data for tests and benchmarks)

An azureml:// URI names a datastore, not a container: `parse_datastore_uri` turns it into a
`DatastoreRef`, and `blobmount.datastores.resolve_source` looks the name up in the datastores
file to build the `SourceSpec` (with the datastore's `CredentialRef`). `parse_source` alone refuses
azureml:// because it reads no files. Errors echo the URI with secrets masked (`redact_uri`).

A synthetic:// URI reaches no storage at all: it describes a made-up container whose names and
bytes follow from its query (`blobmount.storage.synthetic`), for tests and benchmarks that must
measure the mount rather than a storage emulator. It needs no credentials.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import SplitResult, parse_qsl, quote, unquote, urlsplit

from blobmount.errors import SourceError
from blobmount.units import parse_size

__all__ = [
    "DATASTORE_NAME_RE",
    "SYNTHETIC_KEYS",
    "CredentialKind",
    "CredentialRef",
    "DatastoreRef",
    "SourceSpec",
    "container_problem",
    "is_datastore_uri",
    "parse_datastore_uri",
    "parse_source",
    "parse_synthetic_query",
    "redact_uri",
]

#: How a datastore authenticates (see docs/CONFIGURATION.md, "Datastores file").
CredentialKind = Literal[
    "account_key_env",  # an environment variable holds the account key
    "sas_token_env",  # an environment variable holds a SAS token
    "connection_string_env",  # an environment variable holds a connection string
    "account_key_file",  # a file holds the account key
    "sas_token",  # the SAS token is written in the datastores file itself (discouraged)
    "azure_ad",  # DefaultAzureCredential
    "anonymous",  # no credential (public containers)
]


@dataclass(frozen=True, slots=True)
class CredentialRef:
    """Where a datastore's credential comes from; not the credential itself, except for an
    inline SAS (`inline_sas`, a secret: never shown by repr, `label` or messages).

    `reference` is the environment variable's name or the key file's absolute path (neither is
    a secret); `origin` says which datastore and file it came from, for messages.
    """

    kind: CredentialKind
    reference: str | None = None
    inline_sas: str | None = None
    origin: str = ""

    @property
    def label(self) -> str:
        """What kind of credential this is and where it is read from, for people and logs."""
        if self.kind == "account_key_env":
            return f"account key from ${self.reference}"
        if self.kind == "sas_token_env":
            return f"SAS token from ${self.reference}"
        if self.kind == "connection_string_env":
            return f"connection string from ${self.reference}"
        if self.kind == "account_key_file":
            return f"account key from file {self.reference}"
        if self.kind == "sas_token":
            return "SAS token (inline in the datastores file)"
        if self.kind == "azure_ad":
            return "Azure AD (DefaultAzureCredential)"
        return "anonymous"

    def __repr__(self) -> str:
        # The generated repr would print an inline SAS into tracebacks and %r log lines.
        sas = "'***'" if self.inline_sas else "None"
        return (
            f"CredentialRef(kind={self.kind!r}, reference={self.reference!r}, "
            f"inline_sas={sas}, origin={self.origin!r})"
        )


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """Where the data is. `prefix` is '' or ends with '/'.

    `account_url` is the service endpoint including the account for path-style hosts
    (e.g. 'https://acct.blob.core.windows.net' or 'http://127.0.0.1:10000/devstoreaccount1');
    None for az:// (the credentials decide). `sas_token` is a SAS found in the URI's query
    (a secret: never log it; use `display`).

    For an azureml:// source (scheme 'azureml'), `datastore` is the datastore's name and
    `credential` says how that datastore authenticates; it wins over the AZURE_STORAGE_*
    variables. `account_url` is then the datastore's endpoint, or None for "the default one".

    For a synthetic:// source (scheme 'synthetic'), `container` is the name after the scheme and
    `synthetic_query` the dataset's description in canonical form (every key given, in
    `SYNTHETIC_KEYS` order, sizes in bytes; '' when the URI had no query); nothing else is set.
    """

    scheme: str
    container: str
    prefix: str = ""
    account: str | None = None
    account_url: str | None = None
    sas_token: str | None = None
    datastore: str | None = None
    credential: CredentialRef | None = None
    synthetic_query: str | None = None

    @property
    def display(self) -> str:
        """The URI without secrets, for logs and messages."""
        if self.datastore is not None:
            path = quote(self.prefix.rstrip("/"), safe="/")
            return f"azureml://datastores/{self.datastore}/paths/{path}"
        if self.synthetic_query is not None:
            path = quote(f"{self.container}/{self.prefix}".rstrip("/"), safe="/")
            query = f"?{self.synthetic_query}" if self.synthetic_query else ""
            return f"synthetic://{path}{query}"
        base = self.account_url or f"{self.scheme}://"
        sep = "/" if self.account_url else ""
        return f"{base}{sep}{self.container}/{self.prefix}".rstrip("/")

    def __repr__(self) -> str:
        # The generated repr would print the SAS into tracebacks and %r log lines.
        sas = "'***'" if self.sas_token else "None"
        text = (
            f"SourceSpec(scheme={self.scheme!r}, container={self.container!r}, "
            f"prefix={self.prefix!r}, account={self.account!r}, "
            f"account_url={self.account_url!r}, sas_token={sas}"
        )
        if self.datastore is not None:
            text += f", datastore={self.datastore!r}, credential={self.credential!r}"
        if self.synthetic_query is not None:
            text += f", synthetic_query={self.synthetic_query!r}"
        return text + ")"


@dataclass(frozen=True, slots=True)
class DatastoreRef:
    """An azureml:// URI, parsed: which datastore, and which folder of it.

    `subscription`, `resource_group` and `workspace` are set only by the long form. Only
    `workspace` is used (to pick a datastore scoped to that workspace); the others are kept for
    messages and otherwise ignored.
    """

    name: str
    prefix: str = ""
    subscription: str | None = None
    resource_group: str | None = None
    workspace: str | None = None


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
        # Reaching here means a caller skipped the datastores file; say what would work.
        raise _error(
            uri,
            "an azureml:// URI names a datastore, which must be resolved through the "
            "datastores file (blobmount.datastores.resolve_source)",
        )
    if scheme == "synthetic":
        return _parse_synthetic(uri, text)
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


def container_problem(name: str) -> str | None:
    """Why `name` is not a valid container name, or None if it is (for the datastores file)."""
    if not _CONTAINER_RE.fullmatch(name):
        return (
            f"container name {name!r} is not valid: Azure container names are 3-63 lowercase "
            "letters, digits and single hyphens, starting and ending with a letter or digit"
        )
    return None


def _container(uri: str, name: str) -> str:
    if not name:
        raise _error(uri, f"no container; expected {_FORMS}")
    problem = container_problem(name)
    if problem is not None:
        raise _error(uri, problem)
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


# -- synthetic:// -------------------------------------------------------------------------

#: what a synthetic:// query may set, in canonical order (see blobmount.storage.synthetic)
SYNTHETIC_KEYS = (
    "small_files",
    "small_size",
    "per_folder",
    "large_files",
    "large_size",
    "seed",
    "latency_us",
)


def parse_synthetic_query(query: str) -> dict[str, int]:
    """The settings a synthetic:// query gives, by key; sizes (`*_size`) accept units ('25KB').

    Only the syntax is checked here (known keys, each once, non-negative whole numbers); what
    a dataset may hold is `blobmount.storage.synthetic.SyntheticDataset`'s to say.

    Raises:
        SourceError: an unknown or repeated key, or a value that is not such a number.
    """
    values: dict[str, int] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:  # a field without '='
        raise SourceError(f"synthetic:// query {query!r} is not key=value pairs") from None
    for key, text in pairs:
        if key not in SYNTHETIC_KEYS:
            raise SourceError(
                f"synthetic:// has no setting {key!r}; known: {', '.join(SYNTHETIC_KEYS)}"
            )
        if key in values:
            raise SourceError(f"synthetic:// sets {key} twice")
        values[key] = _whole_number(key, text)
    return values


def _whole_number(key: str, text: str) -> int:
    try:
        value = parse_size(text) if key.endswith("_size") else int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise SourceError(f"synthetic:// {key}={text!r} is not a non-negative whole number")
    return value


def _parse_synthetic(uri: str, text: str) -> SourceSpec:
    body, _, query = text[len("synthetic://") :].partition("?")
    if "#" in text:
        raise _error(uri, "it has a '#' fragment")
    name_raw, _, path = body.partition("/")
    name = unquote(name_raw)
    if not name:
        raise _error(uri, "no name: expected synthetic://<name>[/<prefix>][?<dataset>]")
    problem = container_problem(name)
    if problem is not None:
        raise _error(uri, problem.replace("container name", "synthetic:// name", 1))
    try:
        values = parse_synthetic_query(query)
    except SourceError as exc:
        raise _error(uri, str(exc)) from None
    canonical = "&".join(f"{key}={values[key]}" for key in SYNTHETIC_KEYS if key in values)
    return SourceSpec(
        scheme="synthetic",
        container=name,
        prefix=_prefix(uri, path),
        synthetic_query=canonical,
    )


# -- azureml:// ---------------------------------------------------------------------------

_AZUREML_FORMS = (
    "azureml://datastores/<name>/paths/<path> or azureml://subscriptions/<subscription>/"
    "resourcegroups/<resource group>/workspaces/<workspace>/datastores/<name>/paths/<path>"
)
#: Azure ML datastore names are letters, digits and underscores; hyphens are let through too.
DATASTORE_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,254}")
# Workspace names: letters, digits, '-' and '_' (3-33 in Azure ML; not enforced here).
_WORKSPACE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}")
# The long form's keywords, as Azure ML writes them (it also spells "resourceGroups").
_LONG_FORM = ("subscriptions", "resourcegroups", "workspaces")


def is_datastore_uri(uri: str) -> bool:
    """Whether `uri` uses the azureml:// scheme (then `parse_datastore_uri` applies)."""
    match = _SCHEME_RE.match(uri.strip())
    return match is not None and match[1].lower() == "azureml"


def parse_datastore_uri(uri: str) -> DatastoreRef:
    """Parse an azureml:// datastore URI (short or long form) into a `DatastoreRef`.

    Keywords (`datastores`, `paths`, `subscriptions`, ...) match in any case; the path after
    `paths/` follows the prefix rules of every other form ('' or 'a/b/', percent-decoded).

    Raises:
        SourceError: not an azureml:// URI, a form other than the two above (data assets,
            missing `paths/`), an empty or invalid datastore or workspace name, a query string,
            a fragment, or a bad path; the message echoes the URI with any SAS masked.
    """
    text = uri.strip()
    if not is_datastore_uri(text):
        raise _error(uri, f"not an azureml:// URI; expected {_AZUREML_FORMS}")
    rest = text[len("azureml://") :]
    if "#" in rest:
        raise _error(uri, "it has a '#' fragment; write '#' in a path as %23")
    if "?" in rest:
        raise _error(
            uri, "azureml:// URIs take no query string (credentials come from the datastore)"
        )
    segments = rest.split("/")
    scope: dict[str, str] = {}
    if segments[0].lower() == "subscriptions":
        for keyword in _LONG_FORM:
            if len(segments) < 2 or segments[0].lower() != keyword or not segments[1]:
                raise _error(uri, f"expected {_AZUREML_FORMS}")
            scope[keyword] = unquote(segments[1])
            segments = segments[2:]
        if not _WORKSPACE_RE.fullmatch(scope["workspaces"]):
            raise _error(uri, f"workspace name {scope['workspaces']!r} is not valid")
    if len(segments) < 2 or segments[0].lower() != "datastores":
        if segments and segments[0].lower() in {"data", "locations"}:
            raise _error(
                uri,
                "Azure ML data asset URIs are not supported; use the datastore URI the asset "
                f"points to ({_AZUREML_FORMS})",
            )
        raise _error(uri, f"expected {_AZUREML_FORMS}")
    name = unquote(segments[1])
    if not name:
        raise _error(uri, "no datastore name after datastores/")
    if not DATASTORE_NAME_RE.fullmatch(name):
        raise _error(
            uri,
            f"datastore name {name!r} is not valid: expected letters, digits and underscores",
        )
    if len(segments) < 3 or segments[2].lower() != "paths":
        raise _error(
            uri, f"no paths/ after the datastore name; expected .../datastores/{name}/paths/<path>"
        )
    return DatastoreRef(
        name=name,
        prefix=_prefix(uri, "/".join(segments[3:])),
        subscription=scope.get("subscriptions"),
        resource_group=scope.get("resourcegroups"),
        workspace=scope.get("workspaces"),
    )
