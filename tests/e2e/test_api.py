"""azureml:// sources and the Python API on real FUSE mounts of Azurite.

A datastores file maps a datastore to the session's Azurite (endpoint = its account URL) with a
credential reference; the mounts go through the CLI and through `blobmount.mount`, which share
one code path. Every mount is torn down even when a test fails (the API's own exit, then a
safety net that lazily unmounts anything left under the test's folder).
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import blobmount
from blobmount.api import MountFailed
from blobmount.runstate import MountRecord
from tests.helpers.mount import is_mounted

pytestmark = [pytest.mark.fuse, pytest.mark.azurite]

FILES = {
    "train/a.bin": b"a" * 5000,
    "train/sub/b.txt": b"hello from b",
    "other/c.txt": b"not under the datastore path",
}
KEY_VAR = "E2E_DATASTORE_KEY"
CONN_VAR = "E2E_DATASTORE_CONN"
SAS_VAR = "E2E_DATASTORE_SAS"


@pytest.fixture
def dataset(azurite) -> Iterator[str]:
    name = f"api-{uuid.uuid4().hex[:8]}"
    azurite.create_container(name)
    azurite.upload_many(name, FILES.items())
    yield name
    azurite.delete_container(name)


@pytest.fixture
def api_env(
    fuse_ok, azurite, dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """This process's environment as a clean user's, with a datastores file for `dataset`.

    Yields the folder everything lives in; unmounts whatever is left mounted under it.
    """
    for name in list(os.environ):
        if name.startswith(("DATASET_", "AZURE_STORAGE", "AZUREML_", "RSLEX_")):
            monkeypatch.delenv(name)
    sas = _container_sas(azurite, dataset)
    datastores = tmp_path / "datastores.toml"
    datastores.write_text(
        f"""
[datastores.bykey]
account = "{azurite.account}"
container = "{dataset}"
endpoint = "{azurite.account_url}"
credential = {{ account_key_env = "{KEY_VAR}" }}

[datastores.byconn]
account = "{azurite.account}"
container = "{dataset}"
credential = {{ connection_string_env = "{CONN_VAR}" }}

[datastores.bysas]
account = "{azurite.account}"
container = "{dataset}"
endpoint = "{azurite.account_url}"
credential = {{ sas_token_env = "{SAS_VAR}" }}

[datastores.inline]
account = "{azurite.account}"
container = "{dataset}"
endpoint = "{azurite.account_url}"
credential = {{ sas_token = "{sas}" }}

[datastores.unset]
account = "{azurite.account}"
container = "{dataset}"
endpoint = "{azurite.account_url}"
credential = {{ account_key_env = "E2E_NOT_SET" }}

[datastores.missing]
account = "{azurite.account}"
container = "no-such-container"
endpoint = "{azurite.account_url}"
credential = {{ account_key_env = "{KEY_VAR}" }}
"""
    )
    datastores.chmod(0o600)
    monkeypatch.setenv("DATASET_MOUNT_DATASTORES_FILE", str(datastores))
    monkeypatch.setenv(KEY_VAR, azurite.account_key)
    monkeypatch.setenv(CONN_VAR, azurite.connection_string)
    monkeypatch.setenv(SAS_VAR, sas)
    monkeypatch.setenv("DATASET_MOUNT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # default daemon logs
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where mount() makes mount points
    try:
        yield tmp_path
    finally:
        for target in _mounts_under(tmp_path):
            subprocess.run(["fusermount3", "-u", "-z", target], check=False)


def _mounts_under(folder: Path) -> list[str]:
    with open("/proc/mounts") as mounts:
        targets = [line.split()[1].replace("\\040", " ") for line in mounts]
    return [t for t in targets if t.startswith(str(folder) + "/")]


def _container_sas(azurite, container: str) -> str:
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    return generate_container_sas(
        azurite.account,
        container,
        account_key=azurite.account_key,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1),
    )


def _signature(sas: str) -> str:
    return next(p for p in sas.split("&") if p.startswith("sig="))[4:]


def _wait_gone(pid: int, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blobmount", *args],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# -- the CLI ------------------------------------------------------------------------------


@pytest.mark.parametrize("datastore", ["bykey", "byconn"])
def test_cli_mounts_an_azureml_uri_resolved_from_the_datastores_file(
    api_env: Path, datastore: str
) -> None:
    mnt = api_env / "mnt"
    mnt.mkdir()
    log_file = api_env / "daemon.log"
    uri = f"azureml://datastores/{datastore}/paths/train"
    done = cli("mount", uri, str(mnt), "--log-file", str(log_file))
    assert done.returncode == 0, done.stderr
    try:
        assert f"mounted azureml://datastores/{datastore}/paths/train at {mnt}" in done.stdout
        assert sorted(os.listdir(mnt)) == ["a.bin", "sub"]
        assert (mnt / "a.bin").read_bytes() == FILES["train/a.bin"]
        assert (mnt / "sub" / "b.txt").read_bytes() == FILES["train/sub/b.txt"]
    finally:
        stopped = cli("unmount", str(mnt))
    assert stopped.returncode == 0, stopped.stderr
    assert not is_mounted(mnt)
    text = log_file.read_text()
    assert "credentials: " in text
    assert f"from ${KEY_VAR if datastore == 'bykey' else CONN_VAR}" in text


def test_cli_long_form_uri_and_the_datastores_listing(api_env: Path, azurite) -> None:
    mnt = api_env / "mnt"
    mnt.mkdir()
    uri = (
        "azureml://subscriptions/0000/resourcegroups/rg/workspaces/ws/datastores/bykey/"
        "paths/train/sub/"
    )
    done = cli("mount", uri, str(mnt))
    assert done.returncode == 0, done.stderr
    try:
        assert os.listdir(mnt) == ["b.txt"]
    finally:
        assert cli("unmount", str(mnt)).returncode == 0
    listing = cli("datastores")
    assert listing.returncode == 0, listing.stderr
    row = next(line for line in listing.stdout.splitlines() if line.startswith("bykey "))
    assert azurite.account_url in row
    assert f"account key from ${KEY_VAR}" in row
    assert azurite.account_key not in listing.stdout


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("azureml://datastores/nosuch/paths/x", ["unknown datastore 'nosuch'", "datastores.toml"]),
        ("azureml://datastores/unset/paths/x", ["E2E_NOT_SET", "is not set", "'unset'"]),
        ("azureml://datastores/bykey/nopaths/x", ["paths/"]),
        ("azureml://datastores/missing/paths/x", ["container"]),
    ],
)
def test_cli_refuses_bad_azureml_sources_before_mounting(
    api_env: Path, uri: str, words: list[str]
) -> None:
    mnt = api_env / "mnt"
    mnt.mkdir()
    done = cli("mount", uri, str(mnt))
    assert done.returncode != 0
    for word in words:
        assert word in done.stderr, done.stderr
    assert not is_mounted(mnt)


# -- the Python API -----------------------------------------------------------------------


def test_context_manager_mounts_reads_and_unmounts(api_env: Path) -> None:
    with blobmount.mount("azureml://datastores/bykey/paths/train") as path:
        assert path.parent == api_env / "tmp"  # a temporary mount point
        assert is_mounted(path)
        assert (path / "a.bin").read_bytes() == FILES["train/a.bin"]
        assert sorted(p.name for p in path.iterdir()) == ["a.bin", "sub"]
        record = MountRecord.load(path)
        assert record is not None
        pid = record.pid
        assert psutil.pid_exists(pid)
    assert not is_mounted(path)
    assert not path.exists()  # the temporary mount point is removed
    assert not psutil.pid_exists(pid)  # exited, and reaped: not even a zombie
    assert MountRecord.load(path) is None


def test_context_manager_unmounts_when_the_body_raises(api_env: Path) -> None:
    class Boom(Exception):
        pass

    mnt = api_env / "given"
    mnt.mkdir()
    link = api_env / "link"
    link.symlink_to(mnt)  # the mount is known by its resolved path
    pid = None
    raised = False
    try:
        with blobmount.mount("azureml://datastores/bykey/paths/train", link) as path:
            assert path == mnt
            pid = MountRecord.load(path).pid
            with open(path / "sub" / "b.txt", "rb") as handle:  # a file still open at the raise
                assert handle.read(5) == b"hello"
                raise Boom
    except Boom:
        raised = True
    assert raised  # the body's exception comes out unchanged
    assert pid is not None
    assert not is_mounted(mnt)
    assert mnt.is_dir()  # a mount point we were given is kept
    assert not psutil.pid_exists(pid)


def test_context_manager_passes_settings_and_uses_plain_uris_too(
    api_env: Path, azurite, dataset: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    log_file = api_env / "api.log"
    uri = f"{azurite.account_url}/{dataset}/other"
    with blobmount.mount(
        uri,
        read_buffer_block_count=80,
        memory_cache_size="0",
        log_file=log_file,
        **{"read_block_size": "1MB"},
    ) as path:
        assert (path / "c.txt").read_bytes() == FILES["other/c.txt"]
    text = log_file.read_text()
    assert "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT=80" in text
    assert "DATASET_MOUNT_MEMORY_CACHE_SIZE=0 B" in text
    assert "DATASET_MOUNT_READ_BLOCK_SIZE=1 MiB" in text


def test_a_mount_that_fails_says_why_and_leaves_nothing(api_env: Path) -> None:
    with (
        pytest.raises(MountFailed, match="container") as info,
        blobmount.mount("azureml://datastores/missing/paths/x"),
    ):
        pytest.fail("mounted a missing container")
    assert info.value.log_file.exists()
    assert list((api_env / "tmp").iterdir()) == []
    assert _mounts_under(api_env) == []


def test_download_of_an_azureml_uri_by_the_api_and_the_command(api_env: Path) -> None:
    dest = api_env / "copy"
    result = blobmount.download("azureml://datastores/bykey/paths/train", dest)
    assert result.ok
    assert (dest / "a.bin").read_bytes() == FILES["train/a.bin"]
    assert (dest / "sub" / "b.txt").read_bytes() == FILES["train/sub/b.txt"]
    assert not (dest / "other").exists()
    # and the command, through the same resolution
    done = cli("download", "azureml://datastores/byconn/paths/train/sub", str(api_env / "copy2"))
    assert done.returncode == 0, done.stderr
    assert (api_env / "copy2" / "b.txt").read_bytes() == FILES["train/sub/b.txt"]


# -- secrets ------------------------------------------------------------------------------


@pytest.mark.parametrize("datastore", ["bykey", "bysas", "inline"])
def test_no_secret_in_logs_output_or_ps(
    api_env: Path, azurite, datastore: str, capfd: pytest.CaptureFixture[str]
) -> None:
    sas = os.environ[SAS_VAR]
    secrets = [azurite.account_key, azurite.account_key[:20], _signature(sas)]
    uri = f"azureml://datastores/{datastore}/paths/train"
    api_log = api_env / "api.log"
    with blobmount.mount(uri, log_level="DEBUG", log_file=api_log) as path:
        assert (path / "a.bin").read_bytes() == FILES["train/a.bin"]
        pid = MountRecord.load(path).pid
        cmdline = " ".join(psutil.Process(pid).cmdline())
        stats = cli("stats", str(path), "--json")
        assert stats.returncode == 0, stats.stderr
    cli_log = api_env / "cli.log"
    mnt = api_env / "mnt"
    mnt.mkdir()
    done = cli("mount", uri, str(mnt), "--log-file", str(cli_log))
    assert done.returncode == 0, done.stderr
    try:
        assert (mnt / "sub" / "b.txt").read_bytes() == FILES["train/sub/b.txt"]
    finally:
        stopped = cli("unmount", str(mnt))
    listing = cli("datastores", "--json")
    captured = capfd.readouterr()
    texts = {
        "api daemon log": api_log.read_text(),
        "cli daemon log": cli_log.read_text(),
        "ps": cmdline,
        "stats": stats.stdout + stats.stderr,
        "cli output": done.stdout + done.stderr + stopped.stdout + stopped.stderr,
        "datastores listing": listing.stdout + listing.stderr,
        "this process": captured.out + captured.err,
    }
    assert "DEBUG" in texts["api daemon log"]  # verbose, and still clean
    assert "credentials: " in texts["cli daemon log"]
    for where, text in texts.items():
        for secret in secrets:
            assert secret not in text, f"a secret leaked into the {where}"
