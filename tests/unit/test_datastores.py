"""The datastores file: where it is, what it accepts, every refusal naming the problem, workspace
scoping, credential references resolved by resolve_access, `blobmount datastores`, and secrets
never shown."""

from __future__ import annotations

import base64
import json
import logging
import textwrap
from pathlib import Path

import pytest
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

from blobmount.cli import main as cli_main
from blobmount.datastores import (
    DATASTORES_FILE_VAR,
    credential_secret,
    datastores_file_path,
    load_datastores,
    parse_datastores,
    resolve_source,
)
from blobmount.errors import ConfigError, CredentialError, SourceError
from blobmount.source import CredentialRef, SourceSpec
from blobmount.storage.azure_auth import resolve_access

KEY = base64.b64encode(b"datastore-key-" * 5).decode()
OTHER_KEY = base64.b64encode(b"o" * 64).decode()
SIG = "SECRETdatastoreSIGNATURE%3D"
SAS = f"sv=2024-08-04&ss=b&srt=co&sp=rl&se=2031-01-01T00%3A00%3A00Z&sig={SIG}"
AZURITE = "http://127.0.0.1:10000/devstoreaccount1"

GOOD = f"""
# every kind of credential reference
[datastores.keyed]
account = "devstoreaccount1"
container = "data"
endpoint = "{AZURITE}/"
credential = {{ account_key_env = "DS_KEY" }}

[datastores.sas_env]
account = "acct"
container = "data"
credential = {{ sas_token_env = "DS_SAS" }}

[datastores.conn]
account = "devstoreaccount1"
container = "data"
credential = {{ connection_string_env = "DS_CONN" }}

[datastores.keyfile]
account = "acct"
container = "data"
endpoint = "https://acct.blob.core.chinacloudapi.cn"
credential = {{ account_key_file = "keys/acct.key" }}

[datastores.inline]
account = "acct"
container = "data"
credential = {{ sas_token = "?{SAS}" }}

[datastores.workspaceblobstore]
account = "wsacct"
container = "azureml-blobstore-1"
credential = "azure_ad"

[datastores.public]
account = "azureopendatastorage"
container = "mnist"
credential = "anonymous"

[workspaces.research.datastores.workspaceblobstore]
account = "researchacct"
container = "azureml-blobstore-2"
credential = "azure_ad"

[workspaces.research.datastores.only_here]
account = "researchacct"
container = "scoped"
credential = "anonymous"
"""


@pytest.fixture
def store(tmp_path: Path) -> Path:
    (tmp_path / "keys").mkdir()
    key_file = tmp_path / "keys" / "acct.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    path = tmp_path / "datastores.toml"
    path.write_text(GOOD)
    path.chmod(0o600)
    return path


def env_for(path: Path, **extra: str) -> dict[str, str]:
    return {DATASTORES_FILE_VAR: str(path), **extra}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ds.toml"
    path.write_text(textwrap.dedent(text))
    path.chmod(0o600)
    return path


def refusal(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_datastores(path=path)
    message = str(info.value)
    assert str(path) in message  # every file problem names the file
    return message


# -- where the file is -------------------------------------------------------------------


def test_file_location_order(tmp_path: Path) -> None:
    assert datastores_file_path({DATASTORES_FILE_VAR: "/etc/ds.toml", "HOME": "/h"}) == (
        Path("/etc/ds.toml"),
        True,
    )
    assert datastores_file_path({"XDG_CONFIG_HOME": "/x", "HOME": "/h"}) == (
        Path("/x/blobmount/datastores.toml"),
        False,
    )
    assert datastores_file_path({"HOME": "/h"}) == (
        Path("/h/.config/blobmount/datastores.toml"),
        False,
    )
    # XDG says a relative XDG_CONFIG_HOME is ignored; blank values count as unset
    assert datastores_file_path({"XDG_CONFIG_HOME": "rel", "HOME": "/h"})[0] == Path(
        "/h/.config/blobmount/datastores.toml"
    )
    assert datastores_file_path({DATASTORES_FILE_VAR: " ", "HOME": "/h"})[1] is False


def test_relative_file_variable_is_taken_from_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert datastores_file_path({DATASTORES_FILE_VAR: "ds.toml"})[0] == tmp_path / "ds.toml"


def test_missing_file_named_by_the_variable(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        resolve_source("azureml://datastores/x/paths/y", env_for(missing))
    assert str(missing) in str(info.value)
    assert DATASTORES_FILE_VAR in str(info.value)
    assert "does not exist" in str(info.value)


def test_missing_default_file_says_where_it_looked_and_how_to_choose_another(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_source("azureml://datastores/x/paths/y", {"XDG_CONFIG_HOME": str(tmp_path)})
    message = str(info.value)
    assert str(tmp_path / "blobmount" / "datastores.toml") in message
    assert DATASTORES_FILE_VAR in message


def test_a_folder_is_not_a_datastores_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a folder"):
        load_datastores(path=tmp_path)


# -- a good file -------------------------------------------------------------------------


def test_good_file_parses_every_credential_kind(store: Path) -> None:
    found = load_datastores(env_for(store))
    assert found.path == store
    by_name = {d.qualified_name: d for d in found.datastores}
    assert sorted(by_name) == [
        "conn",
        "inline",
        "keyed",
        "keyfile",
        "public",
        "research/only_here",
        "research/workspaceblobstore",
        "sas_env",
        "workspaceblobstore",
    ]
    keyed = by_name["keyed"]
    assert (keyed.account, keyed.container, keyed.endpoint) == ("devstoreaccount1", "data", AZURITE)
    assert keyed.credential.kind == "account_key_env"
    assert keyed.credential.reference == "DS_KEY"
    assert by_name["sas_env"].endpoint is None
    # a relative key file is relative to the datastores file, not to the current folder
    assert by_name["keyfile"].credential.reference == str(store.parent / "keys" / "acct.key")
    assert by_name["inline"].credential.inline_sas == SAS  # the leading '?' is dropped
    assert by_name["workspaceblobstore"].credential.kind == "azure_ad"
    assert by_name["public"].credential.kind == "anonymous"
    assert "datastore 'keyed'" in keyed.credential.origin
    assert str(store) in keyed.credential.origin


def test_empty_file_defines_nothing(tmp_path: Path) -> None:
    assert load_datastores(path=write(tmp_path, "# nothing yet\n")).datastores == ()


def test_resolve_short_form(store: Path) -> None:
    spec = resolve_source(
        "azureml://datastores/keyed/paths/train/images/", env_for(store, DS_KEY=KEY)
    )
    assert spec.scheme == "azureml"
    assert spec.datastore == "keyed"
    assert (spec.account, spec.container, spec.prefix) == (
        "devstoreaccount1",
        "data",
        "train/images/",
    )
    assert spec.account_url == AZURITE
    assert spec.credential is not None
    assert spec.credential.kind == "account_key_env"
    assert spec.display == "azureml://datastores/keyed/paths/train/images"


def test_resolve_source_passes_other_forms_to_parse_source(tmp_path: Path) -> None:
    # no datastores file is needed (or read) for them
    env = env_for(tmp_path / "missing.toml")
    assert resolve_source("az://data/x", env) == SourceSpec("az", "data", "x/")


def test_long_form_picks_the_datastore_of_its_workspace(store: Path) -> None:
    long = "azureml://subscriptions/s/resourcegroups/rg/workspaces/{}/datastores/{}/paths/p"
    env = env_for(store)
    spec = resolve_source(long.format("research", "workspaceblobstore"), env)
    assert (spec.account, spec.container) == ("researchacct", "azureml-blobstore-2")
    # another workspace falls back to the top-level entry
    spec = resolve_source(long.format("other", "workspaceblobstore"), env)
    assert (spec.account, spec.container) == ("wsacct", "azureml-blobstore-1")
    # the short form never sees workspace-scoped entries
    spec = resolve_source("azureml://datastores/workspaceblobstore/paths/p", env)
    assert spec.account == "wsacct"
    assert resolve_source(long.format("research", "only_here"), env).container == "scoped"


def test_unknown_datastore_is_named_with_the_file_and_the_known_ones(store: Path) -> None:
    with pytest.raises(SourceError) as info:
        resolve_source("azureml://datastores/nosuch/paths/x", env_for(store))
    message = str(info.value)
    assert "'nosuch'" in message
    assert str(store) in message
    assert "keyed" in message
    assert "research/only_here" in message


def test_workspace_scoped_name_is_unknown_to_the_short_form_and_other_workspaces(
    store: Path,
) -> None:
    with pytest.raises(SourceError, match=r"unknown datastore 'only_here'"):
        resolve_source("azureml://datastores/only_here/paths/x", env_for(store))
    uri = "azureml://subscriptions/s/resourcegroups/r/workspaces/dev/datastores/only_here/paths/x"
    with pytest.raises(SourceError, match=r"'only_here' \(workspace 'dev'\)"):
        resolve_source(uri, env_for(store))


# -- malformed files ---------------------------------------------------------------------


def test_malformed_toml_names_the_file_and_the_position_not_the_text(tmp_path: Path) -> None:
    message = refusal(
        tmp_path,
        f"""
        [datastores.x]
        account = "acct"
        credential = {{ sas_token = "{SAS}" }}
        container = data-without-quotes
        """,
    )
    assert "not valid TOML" in message
    assert "line 5" in message
    assert SIG not in message


@pytest.mark.parametrize("missing", ["account", "container", "credential"])
def test_missing_field_names_the_datastore_and_the_field(tmp_path: Path, missing: str) -> None:
    fields = {
        "account": '"acct"',
        "container": '"data"',
        "credential": '"anonymous"',
    }
    del fields[missing]
    body = "\n".join(f"{k} = {v}" for k, v in fields.items())
    message = refusal(tmp_path, f"[datastores.mystore]\n{body}\n")
    assert "datastore 'mystore'" in message
    assert f"missing '{missing}'" in message


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[datastore.x]\n", "unknown top-level key(s) datastore"),
        ("datastores = 3\n", "'datastores' must be a table"),
        ("[datastores]\nx = 'acct'\n", "expected a table ([datastores.x])"),
        (
            "[datastores.x]\naccount='acct'\ncontainer='data'\ncredential='anonymous'\nacount='a'\n",
            "unknown key(s) acount",
        ),
        ("[datastores.x]\naccount=1\ncontainer='data'\ncredential='anonymous'\n", "'account' must"),
        (
            "[datastores.x]\naccount='acct'\ncontainer='Bad_Name'\ncredential='anonymous'\n",
            "container name 'Bad_Name' is not valid",
        ),
        (
            "[datastores.x]\naccount='Not-Azure'\ncontainer='data'\ncredential='anonymous'\n",
            "account name 'Not-Azure' is not valid",
        ),
        (
            "[datastores.'a.b']\naccount='acct'\ncontainer='data'\ncredential='anonymous'\n",
            "datastore 'a.b'",
        ),
        (
            "[datastores.x]\naccount='acct'\ncontainer='data'\ncredential='anonymous'\n"
            "endpoint='ftp://acct.blob.core.windows.net'\n",
            "'endpoint' must be an http(s) URL",
        ),
        (
            "[datastores.x]\naccount='acct'\ncontainer='data'\ncredential='anonymous'\n"
            "endpoint='https://other.blob.core.windows.net'\n",
            "is for account 'other', not 'acct'",
        ),
        (
            "[datastores.x]\naccount='acct'\ncontainer='data'\ncredential='anonymous'\n"
            "endpoint='http://127.0.0.1:10000/devstoreaccount1'\n",
            "is for account 'devstoreaccount1', not 'acct'",
        ),
        (
            "[datastores.x]\naccount='acct'\ncontainer='data'\ncredential='azure_ad'\n"
            "endpoint='http://127.0.0.1:10000/acct'\n",
            "needs an https endpoint",
        ),
        (
            "[datastores.x]\naccount='acct'\ncontainer='data'\ncredential='key'\n",
            "'credential' must",
        ),
        (
            "[datastores.x]\naccount='acct'\ncontainer='data'\n"
            "credential={ account_key_env='A', sas_token_env='B' }\n",
            "'credential' must",
        ),
        (
            "[datastores.x]\naccount='acct'\ncontainer='data'\ncredential={ password_env='A' }\n",
            "unknown credential key 'password_env'",
        ),
        (
            "[datastores.x]\naccount='acct'\ncontainer='data'\ncredential={ account_key_env='' }\n",
            "must be a non-empty string",
        ),
        (
            "[datastores.x]\naccount='acct'\ncontainer='data'\n"
            "credential={ sas_token='sv=2024&sp=rl' }\n",
            "is not a SAS token (it has no sig= parameter)",
        ),
        ("[workspaces.w]\nx = 1\n", "may only hold [workspaces.w.datastores.<name>]"),
        ("[workspaces.'w x'.datastores.d]\n", "[workspaces.w x] is not a valid workspace name"),
    ],
)
def test_malformed_entries_name_the_problem(tmp_path: Path, text: str, problem: str) -> None:
    assert problem in refusal(tmp_path, text)


@pytest.mark.parametrize(
    "credential",
    [
        f'"{KEY}"',  # the key pasted as the credential itself
        f'{{ account_key_env = "{KEY}" }}',  # the key pasted where a variable name goes
        f'{{ sas_token_env = "{SAS}" }}',
    ],
)
def test_a_secret_in_the_wrong_place_is_refused_without_echoing_it(
    tmp_path: Path, credential: str
) -> None:
    message = refusal(
        tmp_path,
        f"[datastores.x]\naccount='acct'\ncontainer='data'\ncredential={credential}\n",
    )
    assert KEY not in message
    assert SIG not in message


def test_endpoint_with_a_sas_is_refused_and_the_sas_masked(tmp_path: Path) -> None:
    message = refusal(
        tmp_path,
        "[datastores.x]\naccount='acct'\ncontainer='data'\ncredential='anonymous'\n"
        f"endpoint='https://acct.blob.core.windows.net/?{SAS}'\n",
    )
    assert "must not contain a query" in message
    assert SIG not in message


def test_a_malformed_entry_stops_every_datastore(tmp_path: Path) -> None:
    # the file is checked whole: a typo is reported even when another entry is asked for
    path = write(
        tmp_path,
        """
        [datastores.good]
        account = "acct"
        container = "data"
        credential = "anonymous"
        [datastores.bad]
        account = "acct"
        """,
    )
    with pytest.raises(ConfigError, match=r"datastore 'bad'.*missing 'container', 'credential'"):
        resolve_source("azureml://datastores/good/paths/x", env_for(path))


# -- credentials -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "var", "what"),
    [
        ("keyed", "DS_KEY", "account key"),
        ("sas_env", "DS_SAS", "SAS token"),
        ("conn", "DS_CONN", "connection string"),
    ],
)
def test_missing_variable_is_named_with_the_datastore(
    store: Path, name: str, var: str, what: str
) -> None:
    for env in (env_for(store), env_for(store, **{var: "  "})):
        with pytest.raises(CredentialError) as info:
            resolve_source(f"azureml://datastores/{name}/paths/x", env)
        message = str(info.value)
        assert f"environment variable {var}" in message
        assert "is not set" in message
        assert f"datastore {name!r}" in message
        assert what in message


def test_missing_key_file_is_named(store: Path) -> None:
    key_file = store.parent / "keys" / "acct.key"
    key_file.unlink()
    with pytest.raises(CredentialError) as info:
        resolve_source("azureml://datastores/keyfile/paths/x", env_for(store))
    assert str(key_file) in str(info.value)
    assert "does not exist" in str(info.value)
    assert "datastore 'keyfile'" in str(info.value)


@pytest.mark.parametrize(
    ("content", "problem"), [(b"", "is empty"), (b"not base64!!\n", "not hold a valid account key")]
)
def test_bad_key_file_is_named_not_shown(store: Path, content: bytes, problem: str) -> None:
    key_file = store.parent / "keys" / "acct.key"
    key_file.write_bytes(content)
    with pytest.raises(CredentialError) as info:
        resolve_source("azureml://datastores/keyfile/paths/x", env_for(store))
    assert str(key_file) in str(info.value)
    assert problem in str(info.value)
    if content:
        assert content.decode().strip() not in str(info.value)


def test_variable_holding_the_wrong_kind_of_secret_is_refused_without_showing_it(
    store: Path,
) -> None:
    with pytest.raises(CredentialError) as info:
        resolve_source("azureml://datastores/keyed/paths/x", env_for(store, DS_KEY=SAS))
    assert "DS_KEY" in str(info.value)
    assert SIG not in str(info.value)
    with pytest.raises(CredentialError) as info:
        resolve_source("azureml://datastores/sas_env/paths/x", env_for(store, DS_SAS=KEY))
    assert "no sig=" in str(info.value)
    assert KEY not in str(info.value)


def test_credential_secret_reads_each_kind(store: Path) -> None:
    found = {d.qualified_name: d for d in load_datastores(env_for(store)).datastores}
    env = {"DS_KEY": f" {KEY}\n", "DS_SAS": SAS, "DS_CONN": "UseDevelopmentStorage=true"}
    assert credential_secret(found["keyed"].credential, env) == KEY
    assert credential_secret(found["sas_env"].credential, env) == SAS
    assert credential_secret(found["conn"].credential, env) == "UseDevelopmentStorage=true"
    assert credential_secret(found["keyfile"].credential, env) == KEY
    assert credential_secret(found["inline"].credential, env) == SAS
    assert credential_secret(found["public"].credential, env) is None
    assert credential_secret(found["workspaceblobstore"].credential, env) is None


def test_inline_sas_in_a_file_others_can_read_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = f"[datastores.x]\naccount='acct'\ncontainer='data'\ncredential={{ sas_token='{SAS}' }}\n"
    private = write(tmp_path, text)
    with caplog.at_level(logging.WARNING, logger="blobmount.datastores"):
        load_datastores(path=private)
    assert not caplog.records
    shared = tmp_path / "shared.toml"
    shared.write_text(text)
    shared.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="blobmount.datastores"):
        load_datastores(path=shared)
        load_datastores(path=shared)  # once per file and process, not per mount
    assert len(caplog.records) == 1
    assert str(shared) in caplog.text
    assert "inline SAS" in caplog.text
    assert "chmod 600" in caplog.text
    assert SIG not in caplog.text


def test_key_file_others_can_read_is_warned_about(
    store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key_file = store.parent / "keys" / "acct.key"
    key_file.chmod(0o640)
    with caplog.at_level(logging.WARNING, logger="blobmount.datastores"):
        resolve_source("azureml://datastores/keyfile/paths/x", env_for(store))
    assert str(key_file) in caplog.text
    assert KEY not in caplog.text


# -- resolve_access: the datastore's credential decides ----------------------------------


def access_for(store: Path, name: str, **env: str):  # type: ignore[no-untyped-def]
    full_env = env_for(store, **env)
    return resolve_access(
        resolve_source(f"azureml://datastores/{name}/paths/x", full_env), full_env
    )


def test_account_key_from_a_variable(store: Path) -> None:
    access = access_for(store, "keyed", DS_KEY=KEY)
    assert access.account_url == AZURITE
    assert access.account == "devstoreaccount1"
    assert access.container == "data"
    assert isinstance(access.credential, AzureNamedKeyCredential)
    assert access.credential.named_key == ("devstoreaccount1", KEY)
    assert access.method == "account key from $DS_KEY"
    assert KEY not in repr(access)


def test_datastore_credential_wins_over_the_azure_storage_variables(store: Path) -> None:
    access = access_for(
        store,
        "keyed",
        DS_KEY=KEY,
        AZURE_STORAGE_CONNECTION_STRING=f"AccountName=other;AccountKey={OTHER_KEY}",
        AZURE_STORAGE_KEY=OTHER_KEY,
        AZURE_STORAGE_SAS_TOKEN=SAS,
    )
    assert access.credential.named_key == ("devstoreaccount1", KEY)


def test_sas_from_a_variable_and_inline(store: Path) -> None:
    access = access_for(store, "sas_env", DS_SAS=f"?{SAS}")
    assert access.account_url == "https://acct.blob.core.windows.net"  # the default endpoint
    assert isinstance(access.credential, AzureSasCredential)
    assert access.credential.signature == SAS
    access = access_for(store, "inline")
    assert access.credential.signature == SAS
    assert access.method == "SAS token (inline in the datastores file)"
    assert SIG not in repr(access)


def test_key_file_with_a_sovereign_cloud_endpoint(store: Path) -> None:
    access = access_for(store, "keyfile")
    assert access.account_url == "https://acct.blob.core.chinacloudapi.cn"
    assert access.credential.named_key == ("acct", KEY)
    assert access.method.startswith("account key from file ")


def test_connection_string_gives_the_endpoint_when_the_datastore_has_none(store: Path) -> None:
    conn = f"AccountName=devstoreaccount1;AccountKey={KEY};BlobEndpoint=http://127.0.0.1:9/devstoreaccount1"
    access = access_for(store, "conn", DS_CONN=conn)
    assert access.account_url == "http://127.0.0.1:9/devstoreaccount1"
    assert access.credential.named_key == ("devstoreaccount1", KEY)
    assert access.method == "connection string from $DS_CONN"


def test_connection_string_for_another_account_is_refused(store: Path) -> None:
    with pytest.raises(CredentialError) as info:
        access_for(store, "conn", DS_CONN=f"AccountName=other;AccountKey={OTHER_KEY}")
    message = str(info.value)
    assert "'devstoreaccount1'" in message
    assert "'other'" in message
    assert "DS_CONN" in message
    assert OTHER_KEY not in message


def test_malformed_connection_string_names_the_variable(store: Path) -> None:
    with pytest.raises(CredentialError) as info:
        access_for(store, "conn", DS_CONN=f"garbage;AccountKey={KEY}")
    assert "DS_CONN" in str(info.value)
    assert KEY not in str(info.value)


def test_anonymous_and_azure_ad(store: Path) -> None:
    access = access_for(store, "public")
    assert access.credential is None
    assert access.method == "anonymous"
    assert access.account_url == "https://azureopendatastorage.blob.core.windows.net"
    access = access_for(store, "workspaceblobstore")
    assert type(access.credential).__name__ == "DefaultAzureCredential"
    assert access.method == "Azure AD (DefaultAzureCredential)"
    import asyncio

    asyncio.run(access.credential.close())  # constructed only; no token was asked for


# -- blobmount datastores ----------------------------------------------------------------


def test_cli_lists_datastores_without_secrets(
    store: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(DATASTORES_FILE_VAR, str(store))
    monkeypatch.setenv("DS_KEY", KEY)
    assert cli_main(["datastores"]) == 0
    out = capsys.readouterr().out
    assert str(store) in out
    lines = out.splitlines()
    assert lines[1].split() == ["NAME", "ACCOUNT", "CONTAINER", "ENDPOINT", "CREDENTIAL"]
    keyed = next(line for line in lines if line.startswith("keyed "))
    assert keyed.split()[:4] == ["keyed", "devstoreaccount1", "data", AZURITE]
    assert keyed.endswith("account key from $DS_KEY")
    assert any(line.startswith("research/workspaceblobstore ") for line in lines)
    assert "SAS token (inline in the datastores file)" in out
    assert KEY not in out
    assert SIG not in out

    assert cli_main(["datastores", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["file"] == str(store)
    rows = {(r["workspace"], r["name"]): r for r in data["datastores"]}
    assert rows[(None, "keyed")]["credential"] == "account_key_env"
    assert rows[(None, "keyed")]["endpoint"] == AZURITE
    assert rows[("research", "only_here")]["container"] == "scoped"
    assert KEY not in json.dumps(data)
    assert SIG not in json.dumps(data)


def test_cli_datastores_without_a_file_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(DATASTORES_FILE_VAR, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert cli_main(["datastores"]) == 2  # a configuration mistake
    err = capsys.readouterr().err
    assert str(tmp_path / "blobmount" / "datastores.toml") in err


def test_parse_datastores_is_usable_on_text(tmp_path: Path) -> None:
    found = parse_datastores(
        "[datastores.a]\naccount='acct'\ncontainer='data'\ncredential='anonymous'\n",
        tmp_path / "virtual.toml",
    )
    assert found.find("a") is not None
    assert found.find("b") is None
    assert found.find("a", "some-workspace") == found.find("a")


def test_credential_ref_from_the_file_hides_an_inline_sas(store: Path) -> None:
    found = {d.name: d for d in load_datastores(env_for(store)).datastores}
    ref: CredentialRef = found["inline"].credential
    for text in (repr(ref), repr(found["inline"]), ref.label):
        assert SIG not in text
