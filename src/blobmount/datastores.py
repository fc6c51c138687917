"""Azure ML datastore names → storage locations and credential references: the datastores file.

An ``azureml://datastores/<name>/paths/<path>`` URI names a datastore, which Azure ML keeps in a
workspace. blobmount asks no service: a local TOML file maps each name to an account, a
container, an optional endpoint and a credential reference (docs/CONFIGURATION.md, "Datastores
file")::

    [datastores.training]
    account = "mystorageacct"
    container = "training-data"
    endpoint = "https://mystorageacct.blob.core.windows.net"    # optional
    credential = { account_key_env = "TRAINING_STORAGE_KEY" }

    [workspaces.research.datastores.training]     # used by long-form URIs of workspace "research"
    ...

The file is `DATASET_MOUNT_DATASTORES_FILE`, else ``$XDG_CONFIG_HOME/blobmount/datastores.toml``,
else ``~/.config/blobmount/datastores.toml``. It is read whole and checked whole: a malformed
entry stops every azureml:// source, naming the file, the datastore and the key. Secrets (an
inline SAS, the values of the variables and key files it points at) never appear in messages,
reprs or logs; only kinds, variable names and file paths do.

`resolve_source(uri, env)` is the one entry point for every command that takes a URI: other
forms go to `parse_source`, azureml:// ones through this file.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import re
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

from blobmount.errors import BlobmountError, ConfigError, CredentialError, SourceError
from blobmount.source import (
    DATASTORE_NAME_RE,
    CredentialKind,
    CredentialRef,
    DatastoreRef,
    SourceSpec,
    container_problem,
    is_datastore_uri,
    parse_datastore_uri,
    parse_source,
    redact_uri,
)

__all__ = [
    "DATASTORES_FILE_VAR",
    "Datastore",
    "DatastoresFile",
    "credential_secret",
    "datastores_file_path",
    "load_datastores",
    "parse_datastores",
    "resolve_source",
]

log = logging.getLogger(__name__)

DATASTORES_FILE_VAR: Final = "DATASET_MOUNT_DATASTORES_FILE"

#: credential = { <key> = "..." }: the key says what the value is
_TABLE_KINDS: Final[dict[str, CredentialKind]] = {
    "account_key_env": "account_key_env",
    "sas_token_env": "sas_token_env",
    "connection_string_env": "connection_string_env",
    "account_key_file": "account_key_file",
    "sas_token": "sas_token",
}
#: credential = "<name>": kinds that need no secret
_STRING_KINDS: Final[dict[str, CredentialKind]] = {"azure_ad": "azure_ad", "anonymous": "anonymous"}
_DATASTORE_KEYS: Final = ("account", "container", "endpoint", "credential")
_REQUIRED_KEYS: Final = ("account", "container", "credential")

# Azure account names are 3-24 lowercase letters and digits; with a custom endpoint (Azurite,
# proxies) the account may be any URL-safe name, as in path-style source URIs.
_AZURE_ACCOUNT_RE = re.compile(r"[a-z0-9]{3,24}")
_ANY_ACCOUNT_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})")
_WORKSPACE_KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}")
_BLOB_HOST_RE = re.compile(r"(?P<account>[^.]+?)(?:-secondary)?\.(?:z\d+\.)?blob\..+")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Paths already warned about in this process, so repeated mounts do not repeat the warning.
_warned: set[str] = set()


@dataclass(frozen=True, slots=True)
class Datastore:
    """One entry of the datastores file. `workspace` is None for a top-level entry.

    `endpoint` is None when the file gives none: the connection string's endpoint for
    `connection_string_env`, else ``https://<account>.blob.core.windows.net``.
    """

    name: str
    workspace: str | None
    account: str
    container: str
    endpoint: str | None
    credential: CredentialRef

    @property
    def qualified_name(self) -> str:
        return self.name if self.workspace is None else f"{self.workspace}/{self.name}"


@dataclass(frozen=True, slots=True)
class DatastoresFile:
    """A parsed, checked datastores file."""

    path: Path
    datastores: tuple[Datastore, ...]

    def find(self, name: str, workspace: str | None = None) -> Datastore | None:
        """The datastore `name`: first one scoped to `workspace` (if given), else a top-level
        one; None if there is neither."""
        candidates = {d.workspace: d for d in self.datastores if d.name == name}
        if workspace is not None and workspace in candidates:
            return candidates[workspace]
        return candidates.get(None)


# -- where the file is ---------------------------------------------------------------------


def datastores_file_path(env: Mapping[str, str] | None = None) -> tuple[Path, bool]:
    """(path of the datastores file, whether DATASET_MOUNT_DATASTORES_FILE chose it).

    The path may not exist. A relative DATASET_MOUNT_DATASTORES_FILE is taken relative to the
    current directory; `~` is expanded.
    """
    env = os.environ if env is None else env
    configured = env.get(DATASTORES_FILE_VAR, "").strip()
    if configured:
        return Path(configured).expanduser().absolute(), True
    xdg = env.get("XDG_CONFIG_HOME", "").strip()
    if xdg and Path(xdg).is_absolute():  # the XDG spec says to ignore a relative value
        base = Path(xdg)
    else:
        home = env.get("HOME", "").strip()
        base = (Path(home) if home else Path.home()) / ".config"
    return base / "blobmount" / "datastores.toml", False


def load_datastores(
    env: Mapping[str, str] | None = None, path: Path | None = None
) -> DatastoresFile:
    """Read and check the datastores file (`path`, else the one `datastores_file_path` names).

    Raises:
        ConfigError: the file is missing or unreadable, is not valid TOML, or has an entry with
            a missing, unknown or invalid key; the message names the file, the datastore and the
            key, never a value that could be a secret.
    """
    explicit = path is not None
    if path is None:
        path, explicit = datastores_file_path(env)
    try:
        with open(path, "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            data = b"" if stat.S_ISDIR(mode) else handle.read()
    except IsADirectoryError:
        raise ConfigError(f"the datastores file {path} is a folder, not a file") from None
    except FileNotFoundError:
        if explicit:
            raise ConfigError(
                f"the datastores file {path} (from {DATASTORES_FILE_VAR}) does not exist"
            ) from None
        raise ConfigError(
            f"there is no datastores file at {path}: create it (see docs/CONFIGURATION.md, "
            f"'Datastores file') or set {DATASTORES_FILE_VAR}"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"the datastores file {path} cannot be read: {exc.strerror or exc}"
        ) from None
    if stat.S_ISDIR(mode):
        raise ConfigError(f"the datastores file {path} is a folder, not a file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"the datastores file {path} is not UTF-8 text") from None
    datastores = parse_datastores(text, path)
    if any(d.credential.kind == "sas_token" for d in datastores.datastores):
        _warn_if_shared(path, mode, "holds an inline SAS token")
    return datastores


def parse_datastores(text: str, path: Path) -> DatastoresFile:
    """Parse and check the content of a datastores file; `path` is for messages and for key
    file paths, which are relative to the file's folder.

    Raises:
        ConfigError: as `load_datastores`.
    """
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's messages give the position, never the offending text (which may be a SAS)
        raise ConfigError(f"the datastores file {path} is not valid TOML: {exc}") from None
    unknown = sorted(set(document) - {"datastores", "workspaces"})
    if unknown:
        raise ConfigError(
            f"the datastores file {path} has unknown top-level key(s) {', '.join(unknown)}; "
            "expected [datastores.<name>] and [workspaces.<workspace>.datastores.<name>] tables"
        )
    entries = [*_parse_table(document.get("datastores", {}), path, None, "datastores")]
    workspaces = document.get("workspaces", {})
    if not isinstance(workspaces, dict):
        raise ConfigError(f"the datastores file {path}: 'workspaces' must be a table")
    for workspace, body in workspaces.items():
        where = f"workspaces.{workspace}"
        if not _WORKSPACE_KEY_RE.fullmatch(workspace):
            raise ConfigError(
                f"the datastores file {path}: [{where}] is not a valid workspace name"
            )
        if not isinstance(body, dict) or set(body) - {"datastores"}:
            raise ConfigError(
                f"the datastores file {path}: [{where}] may only hold "
                f"[{where}.datastores.<name>] tables"
            )
        entries += _parse_table(body.get("datastores", {}), path, workspace, where + ".datastores")
    return DatastoresFile(path, tuple(entries))


def _parse_table(table: object, path: Path, workspace: str | None, where: str) -> list[Datastore]:
    if not isinstance(table, dict):
        raise ConfigError(f"the datastores file {path}: '{where}' must be a table of datastores")
    out = []
    for name, body in table.items():
        origin = f"datastore {name!r}" + (f" of workspace {workspace!r}" if workspace else "")
        origin += f" in {path}"
        if not DATASTORE_NAME_RE.fullmatch(name):
            raise ConfigError(
                f"{origin}: the name is not valid (letters, digits and underscores, as in "
                "azureml://datastores/<name>/...)"
            )
        if not isinstance(body, dict):
            raise ConfigError(f"{origin}: expected a table ([{where}.{name}]) with its settings")
        out.append(_parse_datastore(name, workspace, body, path, origin))
    return out


def _parse_datastore(
    name: str, workspace: str | None, body: dict[str, Any], path: Path, origin: str
) -> Datastore:
    unknown = sorted(set(body) - set(_DATASTORE_KEYS))
    if unknown:
        raise ConfigError(
            f"{origin}: unknown key(s) {', '.join(unknown)}; expected {', '.join(_DATASTORE_KEYS)}"
        )
    missing = [key for key in _REQUIRED_KEYS if key not in body]
    if missing:
        raise ConfigError(f"{origin}: missing {', '.join(repr(k) for k in missing)}")
    for key in ("account", "container", "endpoint"):
        if key in body and not isinstance(body[key], str):
            raise ConfigError(f"{origin}: {key!r} must be a string")
    container = body["container"]
    problem = container_problem(container)
    if problem is not None:
        raise ConfigError(f"{origin}: {problem}")
    endpoint = _endpoint(body.get("endpoint"), origin)
    account = _account(body["account"], endpoint, origin)
    credential = _credential(body["credential"], path, origin)
    if credential.kind == "azure_ad" and endpoint is not None and endpoint.startswith("http:"):
        raise ConfigError(
            f"{origin}: credential 'azure_ad' needs an https endpoint (Azure AD tokens are "
            "never sent over plain http)"
        )
    return Datastore(name, workspace, account, container, endpoint, credential)


def _endpoint(raw: str | None, origin: str) -> str | None:
    if raw is None:
        return None
    try:
        parts = urlsplit(raw.strip())
        parts.port  # noqa: B018  (urlsplit checks the port only when it is read)
    except ValueError:
        raise ConfigError(f"{origin}: 'endpoint' is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{origin}: 'endpoint' must be an http(s) URL, e.g. {_EXAMPLE_URL}")
    if parts.query or parts.fragment or "@" in parts.netloc:
        # a SAS belongs in the credential, where it is kept secret; the endpoint is logged
        raise ConfigError(
            f"{origin}: 'endpoint' {redact_uri(raw)!r} must not contain a query, fragment or "
            "user name; put a SAS token in 'credential'"
        )
    return raw.strip().rstrip("/")


_EXAMPLE_URL = "https://<account>.blob.core.windows.net or http://127.0.0.1:10000/devstoreaccount1"


def _account(account: str, endpoint: str | None, origin: str) -> str:
    pattern = _AZURE_ACCOUNT_RE if endpoint is None else _ANY_ACCOUNT_RE
    if not pattern.fullmatch(account):
        raise ConfigError(
            f"{origin}: account name {account!r} is not valid: Azure account names are 3-24 "
            "lowercase letters and digits"
        )
    if endpoint is not None:
        # Catch a copy-paste slip here rather than as 403s from storage later.
        parts = urlsplit(endpoint)
        host_match = _BLOB_HOST_RE.fullmatch(parts.hostname or "")
        segments = [s for s in parts.path.split("/") if s]
        if host_match is not None:
            named: str | None = host_match["account"]
        else:  # path-style, as Azurite: http://127.0.0.1:10000/<account>
            named = segments[0] if len(segments) == 1 else None
        if named is not None and named != account:
            raise ConfigError(
                f"{origin}: the endpoint {endpoint} is for account {named!r}, not {account!r}"
            )
    return account


def _credential(raw: object, path: Path, origin: str) -> CredentialRef:
    expected = (
        f"'azure_ad', 'anonymous', or a table with one of {', '.join(_TABLE_KINDS)} "
        '(e.g. credential = { account_key_env = "MY_STORAGE_KEY" })'
    )
    if isinstance(raw, str):
        kind = _STRING_KINDS.get(raw)
        if kind is None:
            # The value is not echoed: a user may have pasted the secret itself here.
            raise ConfigError(f"{origin}: 'credential' must be {expected}")
        return CredentialRef(kind, origin=origin)
    if not isinstance(raw, dict) or len(raw) != 1:
        raise ConfigError(f"{origin}: 'credential' must be {expected}")
    ((key, value),) = raw.items()
    table_kind = _TABLE_KINDS.get(key)
    if table_kind is None:
        raise ConfigError(
            f"{origin}: unknown credential key {key!r}; 'credential' must be {expected}"
        )
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{origin}: credential {key!r} must be a non-empty string")
    if table_kind == "sas_token":
        _check_sas(value, f"{origin}: the inline credential 'sas_token'")
        return CredentialRef("sas_token", inline_sas=value.strip().lstrip("?"), origin=origin)
    if table_kind == "account_key_file":
        key_path = Path(value).expanduser()
        if not key_path.is_absolute():
            key_path = path.parent / key_path  # relative to the datastores file, not the cwd
        return CredentialRef(table_kind, reference=str(key_path), origin=origin)
    if not _ENV_NAME_RE.fullmatch(value):
        raise ConfigError(
            f"{origin}: credential {key!r} must name an environment variable "
            "(letters, digits and underscores), not hold the secret itself"
        )
    return CredentialRef(table_kind, reference=value, origin=origin)


# -- credentials ----------------------------------------------------------------------------


def credential_secret(ref: CredentialRef, env: Mapping[str, str] | None = None) -> str | None:
    """The secret `ref` points at: the variable's value, the key file's content or the inline
    SAS, stripped; None for Azure AD and anonymous. Keys are checked to be base64 and SAS
    tokens to have a signature, so a mix-up is reported before anything is mounted.

    Raises:
        CredentialError: the variable is unset or empty, the key file is missing, unreadable or
            empty, or the value is not what the kind says; the message names the datastore and
            the variable or file, never the value.
    """
    env = os.environ if env is None else env
    kind = ref.kind
    if kind in ("azure_ad", "anonymous"):
        return None
    if kind == "sas_token":
        assert ref.inline_sas is not None
        return ref.inline_sas
    assert ref.reference is not None
    if kind == "account_key_file":
        secret = _read_key_file(Path(ref.reference), ref.origin)
        _check_key(secret, f"{ref.origin}: the key file {ref.reference}")
        return secret
    what = {
        "account_key_env": "its account key",
        "sas_token_env": "its SAS token",
        "connection_string_env": "its connection string",
    }[kind]
    secret = env.get(ref.reference, "").strip()
    if not secret:
        raise CredentialError(
            f"{ref.origin} takes {what} from the environment variable {ref.reference}, "
            "which is not set"
        )
    where = f"{ref.origin}: the environment variable {ref.reference}"
    if kind == "account_key_env":
        _check_key(secret, where)
    elif kind == "sas_token_env":
        _check_sas(secret, where, error=CredentialError)
    return secret


def _read_key_file(path: Path, origin: str) -> str:
    try:
        with open(path, "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            raw = handle.read(64 * 1024)  # an account key is 88 characters; never read a huge file
    except FileNotFoundError:
        raise CredentialError(f"{origin}: the key file {path} does not exist") from None
    except OSError as exc:
        raise CredentialError(
            f"{origin}: the key file {path} cannot be read: {exc.strerror or exc}"
        ) from None
    _warn_if_shared(path, mode, "holds an account key")
    try:
        secret = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        secret = ""
    if not secret:
        raise CredentialError(f"{origin}: the key file {path} is empty or not text")
    return secret


def _check_key(key: str, where: str) -> None:
    try:
        if not base64.b64decode(key, validate=True):
            raise ValueError
    except (binascii.Error, ValueError):
        raise CredentialError(f"{where} does not hold a valid account key (base64)") from None


def _check_sas(sas: str, where: str, *, error: type[BlobmountError] = ConfigError) -> None:
    fields = {k.lower(): v for k, v in parse_qsl(sas.strip().lstrip("?"), keep_blank_values=True)}
    if not fields.get("sig"):
        raise error(f"{where} is not a SAS token (it has no sig= parameter)")


def _warn_if_shared(path: Path, mode: int, holds: str) -> None:
    if mode & 0o077 and str(path) not in _warned:
        _warned.add(str(path))
        log.warning(
            "%s %s but other users can read it (mode %04o); run: chmod 600 %s",
            path,
            holds,
            stat.S_IMODE(mode),
            path,
        )


# -- URIs -----------------------------------------------------------------------------------


def resolve_datastore(
    ref: DatastoreRef, env: Mapping[str, str] | None = None, *, path: Path | None = None
) -> SourceSpec:
    """The `SourceSpec` of a parsed azureml:// URI, from the datastores file.

    The datastore's credential is checked to be available now (variable set, key file
    readable), so a mount fails before it starts; it is read again when the mount connects.

    Raises:
        ConfigError: the datastores file is missing or malformed (see `load_datastores`).
        SourceError: the file has no datastore of that name (the message lists the ones it has).
        CredentialError: the datastore's credential is missing (see `credential_secret`).
    """
    datastores = load_datastores(env, path)
    datastore = datastores.find(ref.name, ref.workspace)
    if datastore is None:
        known = ", ".join(d.qualified_name for d in datastores.datastores) or "none"
        scope = f" (workspace {ref.workspace!r})" if ref.workspace else ""
        raise SourceError(
            f"unknown datastore {ref.name!r}{scope}: the datastores file {datastores.path} "
            f"does not define it (it defines: {known})"
        )
    credential_secret(datastore.credential, env)
    return SourceSpec(
        scheme="azureml",
        container=datastore.container,
        prefix=ref.prefix,
        account=datastore.account,
        account_url=datastore.endpoint,
        datastore=ref.name,
        credential=datastore.credential,
    )


def resolve_source(uri: str, env: Mapping[str, str] | None = None) -> SourceSpec:
    """Parse any source URI; azureml:// ones are resolved through the datastores file.

    A synthetic:// URI (made-up data for tests and benchmarks) is parsed like the other forms:
    it names no datastore and needs no credentials, so nothing is read or looked up for it.

    Raises:
        SourceError, ConfigError, CredentialError: see `parse_source` and `resolve_datastore`.
    """
    if is_datastore_uri(uri):
        return resolve_datastore(parse_datastore_uri(uri), env)
    return parse_source(uri)
