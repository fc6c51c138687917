"""Source URIs: every accepted form (azureml:// too), every refusal, and the SAS never shown."""

from __future__ import annotations

import pytest

from blobmount.datastores import DATASTORES_FILE_VAR, resolve_source
from blobmount.errors import SourceError
from blobmount.source import (
    CredentialRef,
    DatastoreRef,
    SourceSpec,
    container_problem,
    is_datastore_uri,
    parse_datastore_uri,
    parse_source,
    redact_uri,
)

SECRET = "c2VjcmV0c2lnbmF0dXJl%3D"
SAS = f"sv=2022-11-02&ss=b&srt=co&sp=rl&se=2030-01-01T00:00:00Z&sig={SECRET}"


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("az://datasets", SourceSpec("az", "datasets")),
        ("az://datasets/", SourceSpec("az", "datasets")),
        ("az://datasets/imagenet", SourceSpec("az", "datasets", "imagenet/")),
        ("az://datasets/imagenet/train/", SourceSpec("az", "datasets", "imagenet/train/")),
        ("AZ://datasets/x", SourceSpec("az", "datasets", "x/")),
        ("  az://datasets/x \n", SourceSpec("az", "datasets", "x/")),
        ("az://$root/x", SourceSpec("az", "$root", "x/")),
        ("az://my-data-2024/x", SourceSpec("az", "my-data-2024", "x/")),
        ("az://abc/a%20b/%C3%A9t%C3%A9", SourceSpec("az", "abc", "a b/été/")),
        ("az://abc/a%2Fb", SourceSpec("az", "abc", "a/b/")),
        ("az://abc/q%3Fx%23y", SourceSpec("az", "abc", "q?x#y/")),
        ("az://abc/a+b", SourceSpec("az", "abc", "a+b/")),
        ("az://abc/.hidden/..x", SourceSpec("az", "abc", ".hidden/..x/")),
    ],
)
def test_az(uri: str, expected: SourceSpec) -> None:
    assert parse_source(uri) == expected


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (
            "https://acct.blob.core.windows.net/data",
            SourceSpec("https", "data", "", "acct", "https://acct.blob.core.windows.net"),
        ),
        (
            "https://acct.blob.core.windows.net/data/a/b",
            SourceSpec("https", "data", "a/b/", "acct", "https://acct.blob.core.windows.net"),
        ),
        (
            "HTTPS://ACCT.Blob.Core.Windows.Net/data/Mixed/Case",
            SourceSpec(
                "https", "data", "Mixed/Case/", "acct", "https://acct.blob.core.windows.net"
            ),
        ),
        (
            "https://acct.blob.core.chinacloudapi.cn/data/x",
            SourceSpec("https", "data", "x/", "acct", "https://acct.blob.core.chinacloudapi.cn"),
        ),
        (
            "https://acct.z12.blob.storage.azure.net/data",
            SourceSpec("https", "data", "", "acct", "https://acct.z12.blob.storage.azure.net"),
        ),
        (
            # the read-only secondary endpoint of account "acct"
            "https://acct-secondary.blob.core.windows.net/data",
            SourceSpec("https", "data", "", "acct", "https://acct-secondary.blob.core.windows.net"),
        ),
        (
            # Azurite's host-style spelling
            "http://devstoreaccount1.blob.localhost:10000/data/p",
            SourceSpec(
                "http",
                "data",
                "p/",
                "devstoreaccount1",
                "http://devstoreaccount1.blob.localhost:10000",
            ),
        ),
    ],
)
def test_https_host_style(uri: str, expected: SourceSpec) -> None:
    assert parse_source(uri) == expected


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (
            "http://127.0.0.1:10000/devstoreaccount1/data",
            SourceSpec(
                "http", "data", "", "devstoreaccount1", "http://127.0.0.1:10000/devstoreaccount1"
            ),
        ),
        (
            "http://localhost:10000/devstoreaccount1/data/x/y/",
            SourceSpec(
                "http",
                "data",
                "x/y/",
                "devstoreaccount1",
                "http://localhost:10000/devstoreaccount1",
            ),
        ),
        (
            "http://[::1]:10000/devstoreaccount1/data",
            SourceSpec(
                "http", "data", "", "devstoreaccount1", "http://[::1]:10000/devstoreaccount1"
            ),
        ),
        (
            "https://storage.example.com/acct/data/p",
            SourceSpec("https", "data", "p/", "acct", "https://storage.example.com/acct"),
        ),
    ],
)
def test_http_path_style(uri: str, expected: SourceSpec) -> None:
    assert parse_source(uri) == expected


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (
            "wasbs://data@acct.blob.core.windows.net",
            SourceSpec("wasbs", "data", "", "acct", "https://acct.blob.core.windows.net"),
        ),
        (
            "wasbs://data@acct.blob.core.windows.net/x/y",
            SourceSpec("wasbs", "data", "x/y/", "acct", "https://acct.blob.core.windows.net"),
        ),
        (
            "wasb://data@acct.blob.core.windows.net/x",
            SourceSpec("wasb", "data", "x/", "acct", "http://acct.blob.core.windows.net"),
        ),
        (
            "WASBS://data@ACCT.blob.core.usgovcloudapi.net/",
            SourceSpec("wasbs", "data", "", "acct", "https://acct.blob.core.usgovcloudapi.net"),
        ),
    ],
)
def test_wasb(uri: str, expected: SourceSpec) -> None:
    assert parse_source(uri) == expected


def test_sas_in_the_query_becomes_the_sas_token() -> None:
    spec = parse_source(f"https://acct.blob.core.windows.net/data/p?{SAS}")
    assert spec.sas_token == SAS  # as given, still percent-encoded, without '?'
    assert spec.account_url == "https://acct.blob.core.windows.net"
    assert spec.prefix == "p/"


def test_sas_on_a_path_style_uri() -> None:
    spec = parse_source(f"http://127.0.0.1:10000/devstoreaccount1/data?{SAS}")
    assert spec.sas_token == SAS
    assert spec.account_url == "http://127.0.0.1:10000/devstoreaccount1"


def test_empty_query_is_ignored() -> None:
    assert parse_source("https://acct.blob.core.windows.net/data?").sas_token is None


def test_display_and_repr_never_show_the_sas() -> None:
    spec = parse_source(f"https://acct.blob.core.windows.net/data/p?{SAS}")
    assert spec.display == "https://acct.blob.core.windows.net/data/p"
    assert SECRET not in repr(spec)
    assert SECRET not in str(spec)
    assert "sas_token='***'" in repr(spec)


@pytest.mark.parametrize(
    ("uri", "display"),
    [
        ("az://data", "az://data"),
        ("az://data/a/b/", "az://data/a/b"),
        ("wasbs://data@acct.blob.core.windows.net/x", "https://acct.blob.core.windows.net/data/x"),
        (
            "http://127.0.0.1:10000/devstoreaccount1/data/x",
            "http://127.0.0.1:10000/devstoreaccount1/data/x",
        ),
    ],
)
def test_display(uri: str, display: str) -> None:
    assert parse_source(uri).display == display


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("datasets/imagenet", "not a URI"),
        ("/mnt/data", "not a URI"),
        ("s3://bucket/x", "unsupported scheme 's3://'"),
        ("abfss://data@acct.dfs.core.windows.net/x", "unsupported scheme 'abfss://'"),
        ("az://", "no container"),
        ("az:///x", "no container"),
        ("az://Data", "container name 'Data' is not valid"),
        ("az://ab", "container name 'ab' is not valid"),
        ("az://" + "a" * 64, "is not valid"),
        ("az://-abc", "is not valid"),
        ("az://abc-", "is not valid"),
        ("az://a--bc", "is not valid"),
        ("az://a_bc", "is not valid"),
        ("az://$other", "is not valid"),
        ("az://acct:1/x", "az:// takes a container name, not a host"),
        ("az://c@acct.blob.core.windows.net/x", "az:// takes a container name, not a host"),
        ("az://data/a//b", "empty path segment"),
        ("az://data//a", "empty path segment"),
        ("az://data/a/./b", "'.' segment"),
        ("az://data/a/../b", "'..' segment"),
        ("az://data/..", "'..' segment"),
        ("az://data/a/%2E%2E/b", "'..' segment"),
        ("az://data/a%2F%2Fb", "empty path segment"),
        ("az://data/" + "x" * 1100, "longer than 1024"),
        ("az://data/x?comp=list", "query string is only accepted on http(s)"),
        ("az://data/x#frag", "'#' fragment"),
        ("https://acct.blob.core.windows.net", "no container"),
        ("https://acct.blob.core.windows.net/", "no container"),
        ("https://acct.blob.core.windows.net/Data/x", "container name 'Data' is not valid"),
        ("https://acct.blob.core.windows.net/data//x", "empty path segment"),
        ("https://ac.blob.core.windows.net/data", "storage account name 'ac' is not valid"),
        ("https://my_acct.blob.core.windows.net/data", "storage account name 'my_acct'"),
        ("https://acct.blob.core.windows.net/data?restype=container", "unexpected query string"),
        ("https://acct.blob.core.windows.net/data?sv=1&sig=", "empty sig"),
        ("https://acct.dfs.core.windows.net/data", "Data Lake (dfs) endpoints"),
        ("https://acct.blob.core.windows.net:http/data", "port"),
        ("https://acct.blob.core.windows.net:99999/data", "port"),
        ("https://user:pw@acct.blob.core.windows.net/data", "user names and passwords"),
        ("http://127.0.0.1:10000", "no account"),
        ("http://127.0.0.1:10000/", "no account"),
        ("http://127.0.0.1:10000/devstoreaccount1", "no container"),
        ("http://127.0.0.1:10000/devstoreaccount1/", "no container"),
        ("http://127.0.0.1:10000/dev%20store/data", "account name 'dev store' is not valid"),
        ("http:///devstoreaccount1/data", "no host"),
        ("http://[::1/devstoreaccount1/data", "cannot parse"),
        ("wasbs://acct.blob.core.windows.net/x", "no container"),
        ("wasbs://@acct.blob.core.windows.net/x", "no container"),
        ("wasbs://Data@acct.blob.core.windows.net/x", "container name 'Data' is not valid"),
        ("wasbs://data@127.0.0.1:10000/x", "not of the form <account>.blob."),
        ("wasbs://data@acct.blob.core.windows.net/x?sig=abc", "only accepted on http(s)"),
        ("wasbs://data@acct.blob.core.windows.net/a/../b", "'..' segment"),
    ],
)
def test_errors(uri: str, problem: str) -> None:
    with pytest.raises(SourceError) as info:
        parse_source(uri)
    assert problem in str(info.value)


@pytest.mark.parametrize(
    "uri",
    [
        "azureml://datastores/workspaceblob/paths/my_data",
        "azureml://subscriptions/s/resourcegroups/r/workspaces/w/datastores/d/paths/p",
        "AZUREML://datastores/x/paths/y",
    ],
)
def test_parse_source_alone_refuses_azureml_and_points_at_the_datastores_file(uri: str) -> None:
    with pytest.raises(SourceError, match=r"names a datastore.*datastores file"):
        parse_source(uri)


# -- azureml:// ---------------------------------------------------------------------------

SUB = "00000000-1111-2222-3333-444444444444"


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (
            "azureml://datastores/workspaceblobstore/paths/imagenet/train",
            DatastoreRef("workspaceblobstore", "imagenet/train/"),
        ),
        ("azureml://datastores/ds/paths/a/b/", DatastoreRef("ds", "a/b/")),
        ("azureml://datastores/ds/paths/", DatastoreRef("ds", "")),
        ("azureml://datastores/ds/paths", DatastoreRef("ds", "")),
        ("  azureml://datastores/ds/paths/x \n", DatastoreRef("ds", "x/")),
        ("AZUREML://Datastores/my_ds/Paths/CaseKept", DatastoreRef("my_ds", "CaseKept/")),
        ("azureml://datastores/ds/paths/a%20b/%C3%A9", DatastoreRef("ds", "a b/é/")),
        ("azureml://datastores/ds/paths/q%3Fx%23y", DatastoreRef("ds", "q?x#y/")),
        ("azureml://datastores/ds-1/paths/x", DatastoreRef("ds-1", "x/")),
        (
            f"azureml://subscriptions/{SUB}/resourcegroups/my-rg/workspaces/my-ws/"
            "datastores/workspaceblobstore/paths/data/train",
            DatastoreRef("workspaceblobstore", "data/train/", SUB, "my-rg", "my-ws"),
        ),
        (
            # the portal's spelling: resourceGroups
            f"azureml://subscriptions/{SUB}/resourceGroups/rg.(x)/workspaces/ws_1/"
            "datastores/ds/paths/",
            DatastoreRef("ds", "", SUB, "rg.(x)", "ws_1"),
        ),
    ],
)
def test_parse_datastore_uri(uri: str, expected: DatastoreRef) -> None:
    assert is_datastore_uri(uri)
    assert parse_datastore_uri(uri) == expected


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("az://data/x", "not an azureml:// URI"),
        ("azureml://", "expected azureml://datastores/<name>/paths/<path>"),
        ("azureml://datastores", "expected azureml://datastores/<name>/paths/<path>"),
        ("azureml://datastores/", "no datastore name"),
        ("azureml://datastores//paths/x", "no datastore name"),
        ("azureml://datastores/ds", "no paths/ after the datastore name"),
        ("azureml://datastores/ds/", "no paths/ after the datastore name"),
        ("azureml://datastores/ds/files/x", "no paths/ after the datastore name"),
        ("azureml://datastores/my%20ds/paths/x", "datastore name 'my ds' is not valid"),
        ("azureml://datastores/a.b/paths/x", "datastore name 'a.b' is not valid"),
        ("azureml://datastores/ds/paths/a//b", "empty path segment"),
        ("azureml://datastores/ds/paths/a/../b", "'..' segment"),
        ("azureml://datastores/ds/paths/" + "x" * 1100, "longer than 1024"),
        ("azureml://datastores/ds/paths/x#frag", "'#' fragment"),
        ("azureml://datastores/ds/paths/x?sv=1", "take no query string"),
        ("azureml://workspaces/w/datastores/ds/paths/x", "expected azureml://datastores"),
        ("azureml://subscriptions/s/datastores/ds/paths/x", "expected azureml://datastores"),
        (
            "azureml://subscriptions/s/resourcegroups/r/datastores/ds/paths/x",
            "expected azureml://datastores",
        ),
        (
            "azureml://subscriptions//resourcegroups/r/workspaces/w/datastores/ds/paths/x",
            "expected azureml://datastores",
        ),
        (
            "azureml://subscriptions/s/resourcegroups/r/workspaces/w/paths/x",
            "expected azureml://datastores",
        ),
        (
            "azureml://subscriptions/s/resourcegroups/r/workspaces/w%20x/datastores/d/paths/x",
            "workspace name 'w x' is not valid",
        ),
        (
            "azureml://locations/westeurope/workspaces/abc/data/mnist/versions/1",
            "data asset URIs are not supported",
        ),
        ("azureml://data/mnist/versions/1", "data asset URIs are not supported"),
    ],
)
def test_parse_datastore_uri_errors(uri: str, problem: str) -> None:
    with pytest.raises(SourceError) as info:
        parse_datastore_uri(uri)
    assert problem in str(info.value)


def test_datastore_uri_errors_never_show_a_sas() -> None:
    with pytest.raises(SourceError) as info:
        parse_datastore_uri(f"azureml://datastores/ds/paths/x?{SAS}")
    assert SECRET not in str(info.value)
    assert "sig=***" in str(info.value)


@pytest.mark.parametrize("uri", ["az://data", "https://a.blob.core.windows.net/c", "data", ""])
def test_is_datastore_uri_is_false_for_other_forms(uri: str) -> None:
    assert not is_datastore_uri(uri)


def test_datastore_spec_displays_as_its_uri_and_hides_an_inline_sas() -> None:
    ref = CredentialRef("sas_token", inline_sas=SAS, origin="datastore 'ds' in /x.toml")
    spec = SourceSpec("azureml", "data", "a b/c/", "acct", None, datastore="ds", credential=ref)
    assert spec.display == "azureml://datastores/ds/paths/a%20b/c"
    for text in (repr(spec), str(spec), repr(ref), ref.label, spec.display):
        assert SECRET not in text
    assert "inline_sas='***'" in repr(spec)
    assert "datastore='ds'" in repr(spec)


@pytest.mark.parametrize(
    ("ref", "label"),
    [
        (CredentialRef("account_key_env", "MY_KEY"), "account key from $MY_KEY"),
        (CredentialRef("sas_token_env", "MY_SAS"), "SAS token from $MY_SAS"),
        (CredentialRef("connection_string_env", "CS"), "connection string from $CS"),
        (CredentialRef("account_key_file", "/k/key"), "account key from file /k/key"),
        (CredentialRef("sas_token", inline_sas=SAS), "SAS token (inline in the datastores file)"),
        (CredentialRef("azure_ad"), "Azure AD (DefaultAzureCredential)"),
        (CredentialRef("anonymous"), "anonymous"),
    ],
)
def test_credential_labels_name_the_kind_never_the_secret(ref: CredentialRef, label: str) -> None:
    assert ref.label == label


def test_container_problem() -> None:
    assert container_problem("data") is None
    assert container_problem("$root") is None
    problem = container_problem("Bad_Name")
    assert problem is not None
    assert "'Bad_Name' is not valid" in problem


def test_errors_echo_the_uri() -> None:
    with pytest.raises(SourceError, match=r"'az://Data/x'"):
        parse_source("az://Data/x")


@pytest.mark.parametrize(
    "uri",
    [
        f"https://acct.blob.core.windows.net/Bad_Container/x?{SAS}",  # bad container
        f"https://acct.blob.core.windows.net/data//x?{SAS}",  # bad prefix
        f"https://ac.blob.core.windows.net/data?{SAS}",  # bad account
        f"https://acct.blob.core.windows.net/data?{SAS}#frag",  # fragment
        f"az://data/x?{SAS}",  # query on az://
        f"wasbs://data@acct.blob.core.windows.net/x?{SAS}",  # query on wasbs://
        f"http://127.0.0.1:10000/?{SAS}",  # no account
        f"https://acct.blob.core.windows.net/Bad?SIG={SECRET}&sv=1",  # upper-case SIG
        f"azureml://datastores/x/paths/y?{SAS}",
        f"s3://bucket?{SAS}",
    ],
)
def test_sas_signature_never_appears_in_errors(uri: str) -> None:
    with pytest.raises(SourceError) as info:
        parse_source(uri)
    message = str(info.value)
    assert SECRET not in message
    assert "sig=***" in message.lower()


def test_sas_with_uppercase_sig_is_accepted() -> None:
    spec = parse_source(f"https://acct.blob.core.windows.net/data?sv=1&Sig={SECRET}")
    assert spec.sas_token == f"sv=1&Sig={SECRET}"


def test_redact_uri() -> None:
    assert redact_uri(f"https://a.blob.core.windows.net/c?sv=1&sig={SECRET}&se=x") == (
        "https://a.blob.core.windows.net/c?sv=1&sig=***&se=x"
    )
    assert redact_uri("https://user:pa55@host/c") == "https://user:***@host/c"
    assert redact_uri("wasbs://data@acct.blob.core.windows.net/x") == (
        "wasbs://data@acct.blob.core.windows.net/x"
    )
    assert redact_uri("http://127.0.0.1:10000/a/b") == "http://127.0.0.1:10000/a/b"


# -- synthetic:// (made-up data for tests and benchmarks) ----------------------------------

BENCH_QUERY = "small_files=300&small_size=25000&per_folder=100&large_files=1&large_size=20MB"


@pytest.mark.parametrize(
    ("uri", "prefix", "query"),
    [
        ("synthetic://bench", "", ""),
        ("synthetic://bench/", "", ""),
        ("SYNTHETIC://bench/small/d0001", "small/d0001/", ""),
        ("  synthetic://bench/small/?seed=3 ", "small/", "seed=3"),
        # canonical: keys in a fixed order, sizes in bytes
        (
            f"synthetic://bench?{BENCH_QUERY}",
            "",
            "small_files=300&small_size=25000&per_folder=100&large_files=1&large_size=20971520",
        ),
        ("synthetic://bench?seed=2&small_size=2KB", "", "small_size=2048&seed=2"),
        ("synthetic://bench/large?large_files=2", "large/", "large_files=2"),
    ],
)
def test_synthetic(uri: str, prefix: str, query: str) -> None:
    spec = parse_source(uri)
    assert spec == SourceSpec("synthetic", "bench", prefix, synthetic_query=query)
    # nothing that would lead anyone to look for an account or a credential
    assert (spec.account, spec.account_url, spec.sas_token, spec.datastore) == (None,) * 4


def test_synthetic_display_reads_back_as_the_same_source() -> None:
    spec = parse_source(f"synthetic://bench/small?{BENCH_QUERY}")
    assert spec.display == (
        "synthetic://bench/small?small_files=300&small_size=25000&per_folder=100&large_files=1"
        "&large_size=20971520"
    )
    assert parse_source(spec.display) == spec
    assert parse_source("synthetic://bench").display == "synthetic://bench"
    assert "synthetic_query='seed=4'" in repr(parse_source("synthetic://bench?seed=4"))


def test_synthetic_is_resolved_without_the_datastores_file(tmp_path) -> None:
    # a datastores file that does not parse: resolving a synthetic:// URI must not read it
    broken = tmp_path / "datastores.yaml"
    broken.write_text(": : not yaml [")
    env = {DATASTORES_FILE_VAR: str(broken), "AZURE_STORAGE_ACCOUNT": "acct"}
    spec = resolve_source(f"synthetic://bench?{BENCH_QUERY}", env)
    assert spec == parse_source(f"synthetic://bench?{BENCH_QUERY}")
    assert spec.credential is None


@pytest.mark.parametrize(
    ("uri", "complaint"),
    [
        ("synthetic://", "no name"),
        ("synthetic:///x", "no name"),
        ("synthetic://Bench", "synthetic:// name 'Bench' is not valid"),
        ("synthetic://bench//x", "empty path segment"),
        ("synthetic://bench/../x", "'..' segment"),
        ("synthetic://bench?colour=blue", "no setting 'colour'"),
        ("synthetic://bench?small_files", "not key=value pairs"),
        ("synthetic://bench?small_files=ten", "small_files='ten' is not a non-negative"),
        ("synthetic://bench?small_files=-1", "is not a non-negative whole number"),
        ("synthetic://bench?small_size=1.5", "is not a non-negative whole number"),
        ("synthetic://bench?seed=1&seed=2", "sets seed twice"),
        ("synthetic://bench?seed=1#x", "fragment"),
    ],
)
def test_synthetic_refusals(uri: str, complaint: str) -> None:
    with pytest.raises(SourceError, match=complaint) as info:
        parse_source(uri)
    assert repr(uri.strip()) in str(info.value)
