"""`blobmount download` against a real Azurite: the CLI in a subprocess (exit statuses, summary,
--json request counts), interruption by SIGTERM and SIGKILL, hostile names, failures.

No FUSE needed. Request counts come from the summary's "requests" (CountingStorageClient).
"""

from __future__ import annotations

import datetime
import functools
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from blobmount.compose.download import run_download as download
from blobmount.download_mode.downloader import DownloadConfig
from blobmount.download_mode.manifest import MANIFEST_NAME
from blobmount.download_mode.staging import TMP_DIR_NAME
from blobmount.settings import load_settings
from blobmount.source import parse_source
from blobmount.storage.azure import AzureStorageClient
from blobmount.testing.azurite import AzuriteServer, free_port
from blobmount.testing.pattern import pattern_bytes
from tests.helpers.direct_io import direct_io_supported
from tests.unit.test_download_downloader import Hooked

pytestmark = pytest.mark.azurite

MiB = 1024 * 1024
PART = 1 * MiB
BIG = 40 * MiB + 12345

TREE: dict[str, bytes] = {
    "top.txt": b"top\n",
    "empty.bin": b"",
    "a/b/c/deep.txt": b"deep\n",
    "a/b/empty-too": b"",
    "a/medium.bin": pattern_bytes("medium", 0, 3 * MiB + 7),
    "big/large.bin": pattern_bytes("large", 0, BIG),
    "with space/ünï cødé 文件.txt": "unicode ✓\n".encode(),
}
MARKERS = ("a/marked-empty",)


@pytest.fixture(autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The downloads' resume state goes to $XDG_STATE_HOME: the test's own, also for the CLI
    runs (cli_env copies os.environ), and outside tmp_path, which tests list."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


def source_tree(root: Path) -> Path:
    """TREE and its folder markers as local files: what DEST must equal after a download."""
    for rel, data in TREE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    for rel in MARKERS:
        (root / rel).mkdir(parents=True)
    return root


def gets_for(data: dict[str, bytes], part: int = PART) -> int:
    return sum(-(-len(d) // part) for d in data.values())


def cli_env(azurite: AzuriteServer, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATASET_", "AZURE_STORAGE", "AZUREML_", "RSLEX_"))
    }
    env["AZURE_STORAGE_CONNECTION_STRING"] = azurite.connection_string
    env.update(extra)
    return env


def run_cli(
    args: list[str], env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blobmount", "download", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def summary(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


def local_files(dest: Path) -> dict[str, bytes]:
    out = {}
    for root, _, files in os.walk(dest):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), dest)
            if not rel.startswith(".blobmount-download"):
                out[rel] = Path(root, f).read_bytes()
    return out


def count_files(dest: Path) -> int:
    """Files under final names (cheap: no reading), for polling."""
    return sum(
        1
        for root, _, files in os.walk(dest)
        for f in files
        if not os.path.relpath(os.path.join(root, f), dest).startswith(".blobmount-download")
    )


def assert_no_partials(dest: Path, expected: dict[str, bytes]) -> dict[str, bytes]:
    files = local_files(dest)
    for rel, data in files.items():
        assert data == expected[rel], f"{rel} is not complete"
    assert not (dest / TMP_DIR_NAME).exists()
    return files


@pytest.fixture
def tree(azurite: AzuriteServer, container: str) -> str:
    azurite.upload_many(container, TREE.items())
    for name in MARKERS:
        azurite.upload_folder_marker(container, name)
    return container


def put_raw(azurite: AzuriteServer, container: str, quoted_name: str, data: bytes) -> None:
    """Create a blob whose name the SDK would normalise away ('..', leading '/'): a raw PUT
    with a container SAS, the name percent-encoded as given."""
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    sas = generate_container_sas(
        azurite.account,
        container,
        account_key=azurite.account_key,
        permission=ContainerSasPermissions(write=True, create=True),
        expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1),
    )
    conn = http.client.HTTPConnection("127.0.0.1", azurite.port, timeout=10)
    try:
        conn.request(
            "PUT",
            f"/{azurite.account}/{container}/{quoted_name}?{sas}",
            body=data,
            headers={"x-ms-blob-type": "BlockBlob", "x-ms-version": "2021-08-06"},
        )
        response = conn.getresponse()
        response.read()
        assert response.status == 201, response.status
    finally:
        conn.close()


# -- the CLI: bytes, summary, reruns -------------------------------------------------------


def test_tree_downloads_byte_exact_and_a_rerun_transfers_nothing(
    azurite, tree, tmp_path, state_home
):
    dest = tmp_path / "dest"
    env = cli_env(azurite, RSLEX_DOWNLOADER_THREADS="8")
    uri = f"{azurite.account_url}/{tree}"
    first = run_cli([uri, str(dest), "--part-size", "1MB", "--json"], env)
    assert first.returncode == 0, first.stderr
    out = summary(first)
    assert out["ok"] is True
    assert out["failures"] == []
    assert out["stats"]["files_fetched"] == len(TREE)
    assert out["stats"]["folders"] == 1
    assert out["requests"]["range_requests"] == gets_for(TREE)  # the 40 MiB blob in 41 parts
    assert out["requests"]["range_bytes"] == sum(map(len, TREE.values()))
    assert local_files(dest) == TREE
    large = sum(len(data) for data in TREE.values() if len(data) >= MiB)
    if direct_io_supported(tmp_path):  # the large files went around the page cache
        assert 0.9 * large < out["stats"]["bytes_direct"] <= large
    assert (dest / "a/marked-empty").is_dir()
    assert os.listdir(dest / "a/marked-empty") == []
    # DEST is a copy of the prefix and nothing else (`diff -r` against the source tree): the
    # resume state is kept in the state folder, one file for this source and destination
    diff = subprocess.run(
        ["diff", "-r", str(source_tree(tmp_path / "src")), str(dest)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert diff.returncode == 0, diff.stdout + diff.stderr
    assert not (dest / MANIFEST_NAME).exists()
    (db,) = (state_home / "blobmount" / "downloads").glob("*.db")
    assert db.stat().st_size > 0

    again = run_cli([uri, str(dest), "--part-size", "1MB", "--json"], env)
    assert again.returncode == 0, again.stderr
    out = summary(again)
    assert out["requests"]["range_requests"] == 0
    assert out["requests"]["properties_requests"] == 0
    assert out["stats"]["files_skipped"] == len(TREE)
    assert out["stats"]["files_fetched"] == 0
    assert local_files(dest) == TREE


def test_page_cache_writes_every_file_through_the_page_cache(azurite, tree, tmp_path):
    dest = tmp_path / "dest"
    uri = f"{azurite.account_url}/{tree}"
    proc = run_cli(
        [uri, str(dest), "--part-size", "1MB", "--page-cache", "--json"], cli_env(azurite)
    )
    assert proc.returncode == 0, proc.stderr
    assert summary(proc)["stats"]["bytes_direct"] == 0
    assert local_files(dest) == TREE


@pytest.mark.parametrize("page_cache", [False, True])
def test_the_python_api_writes_around_the_page_cache_unless_asked_not_to(
    azurite, tree, tmp_path, monkeypatch, page_cache
):
    import blobmount

    for name in list(os.environ):
        if name.startswith(("DATASET_", "AZURE_STORAGE", "AZUREML_", "RSLEX_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    dest = tmp_path / "dest"
    result = blobmount.download(f"{azurite.account_url}/{tree}", dest, page_cache=page_cache)
    assert result.ok
    assert local_files(dest) == TREE
    if page_cache or not direct_io_supported(tmp_path):
        assert result.stats.bytes_direct == 0
    else:
        assert result.stats.bytes_direct > 0


def test_text_summary_az_uri_and_prefix(azurite, tree, tmp_path):
    dest = tmp_path / "dest"
    proc = run_cli([f"az://{tree}/a", str(dest)], cli_env(azurite))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("blobmount: downloaded 3 files (3 MiB) in ")
    assert "1 folder markers" in proc.stdout
    expected = {k.removeprefix("a/"): v for k, v in TREE.items() if k.startswith("a/")}
    assert local_files(dest) == expected
    # not on a terminal: progress as log lines on stderr, never a bar
    assert "\r" not in proc.stderr


def test_include_exclude_and_verify(azurite, tree, tmp_path):
    dest = tmp_path / "dest"
    args = [f"{azurite.account_url}/{tree}", str(dest), "--json", "--verify"]
    args += ["--include", "a/*", "--include", "*.txt", "--exclude", "*deep*"]
    proc = run_cli(args, cli_env(azurite))
    assert proc.returncode == 0, proc.stderr
    out = summary(proc)
    kept = {"top.txt", "a/b/empty-too", "a/medium.bin", "with space/ünï cødé 文件.txt"}
    assert set(local_files(dest)) == kept
    # Azurite stores a Content-MD5 for every single-put blob: each was checked
    assert out["stats"]["md5_verified"] == len(kept)
    assert out["stats"]["md5_missing"] == 0
    assert out["stats"]["filtered"] == len(TREE) + len(MARKERS) - len(kept) - 1
    assert (dest / "a/marked-empty").is_dir()


# -- interruption --------------------------------------------------------------------------


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "blobmount", "download", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(predicate, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, "the download ended before the test could interrupt it"
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)


def test_sigterm_stops_cleanly_and_a_rerun_resumes(azurite, container, tmp_path):
    files = {f"d{i % 4}/f{i:03d}.bin": pattern_bytes(f"s{i}", 0, 64 * 1024 + i) for i in range(400)}
    azurite.upload_many(container, files.items())
    dest = tmp_path / "dest"
    env = cli_env(azurite, RSLEX_DOWNLOADER_THREADS="1")
    uri = f"{azurite.account_url}/{container}"
    proc = _start([uri, str(dest), "--json"], env)
    try:
        _wait_for(lambda: count_files(dest) >= 20, proc)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        _stop(proc)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    out = json.loads(stdout)
    assert out["interrupted"] == "SIGTERM"
    assert out["ok"] is False
    done = assert_no_partials(dest, files)
    assert 20 <= len(done) < len(files)
    assert out["stats"]["files_fetched"] == len(done)

    again = run_cli([uri, str(dest), "--json"], cli_env(azurite, RSLEX_DOWNLOADER_THREADS="16"))
    assert again.returncode == 0, again.stderr
    out = summary(again)
    assert out["stats"]["files_skipped"] == len(done)
    assert out["requests"]["range_requests"] == len(files) - len(done)
    assert local_files(dest) == files


def test_sigkill_leaves_no_partial_file_under_a_final_name(azurite, container, tmp_path):
    files = {"big.bin": pattern_bytes("kill", 0, 96 * MiB)}
    files |= {f"small/{i:02d}": pattern_bytes(f"k{i}", 0, 1000) for i in range(10)}
    azurite.upload_many(container, files.items())
    dest = tmp_path / "dest"
    env = cli_env(azurite, RSLEX_DOWNLOADER_THREADS="2")
    uri = f"{azurite.account_url}/{container}"
    args = [uri, str(dest), "--part-size", "1MB", "--json"]
    proc = _start(args, env)
    try:
        tmp_dir = dest / TMP_DIR_NAME
        # killed while the big file is half-written in its temp file
        _wait_for(lambda: any(p.stat().st_blocks > 0 for p in tmp_dir.glob("*.part")), proc)
        proc.kill()
        proc.communicate(timeout=30)
    finally:
        _stop(proc)
    assert proc.returncode == -signal.SIGKILL
    done = local_files(dest)
    assert "big.bin" not in done
    for rel, data in done.items():
        assert data == files[rel]

    again = run_cli(args, env)
    assert again.returncode == 0, again.stderr
    assert assert_no_partials(dest, files) == files


# -- names and failures --------------------------------------------------------------------


def test_hostile_names_are_refused_and_nothing_escapes(azurite, container, tmp_path):
    put_raw(azurite, container, "..%2Fescape", b"evil")  # stored as "../escape"
    put_raw(azurite, container, "%2Fabs", b"evil")  # stored as "/abs"
    put_raw(azurite, container, "sub/..%2F..%2Fescape2", b"evil")
    azurite.upload(container, "a//b", b"evil")
    azurite.upload(container, "long/" + "x" * 300, b"evil")
    azurite.upload(container, "good.txt", b"good")
    outside = tmp_path / "outside"
    dest = outside / "dest"
    proc = run_cli([f"{azurite.account_url}/{container}", str(dest)], cli_env(azurite))

    assert proc.returncode == 1, proc.stderr
    for name, why in [
        ("../escape", "'..'"),
        ("/abs", "absolute"),
        ("sub/../../escape2", "'..'"),
        ("a//b", "empty path segment"),
        ("long/" + "x" * 300, "longer than 255 bytes"),
    ]:
        assert f"  {name}: refused: " in proc.stdout, (name, proc.stdout)
        assert why in proc.stdout
    assert "5 blobs failed:" in proc.stdout
    assert local_files(dest) == {"good.txt": b"good"}
    assert sorted(os.listdir(tmp_path)) == ["outside"]
    assert sorted(os.listdir(outside)) == ["dest"]


def test_unreachable_endpoint_fails_with_a_message(azurite, tmp_path):
    port = free_port()  # nothing listens there
    dead = f"http://127.0.0.1:{port}/{azurite.account}"
    env = cli_env(
        azurite,
        AZUREML_DATASET_HTTP_RETRY_COUNT="1",
        DATASET_MOUNT_CONNECT_TIMEOUT_SECONDS="2",
    )
    proc = run_cli([f"{dead}/data", str(tmp_path / "dest"), "--json"], env)
    assert proc.returncode == 1
    out = summary(proc)
    assert out["ok"] is False
    assert "listing stopped" in out["fatal"]
    assert "connection failed" in out["fatal"]
    assert local_files(tmp_path / "dest") == {}


def test_missing_container_and_bad_arguments(azurite, tmp_path):
    env = cli_env(azurite)
    proc = run_cli([f"{azurite.account_url}/no-such-container", str(tmp_path / "d")], env)
    assert proc.returncode == 1
    assert "container not found" in proc.stdout

    proc = run_cli(["s3://bucket/x", str(tmp_path / "d")], env)
    assert proc.returncode == 2  # a usage mistake
    assert "invalid source URI" in proc.stderr

    (tmp_path / "file").write_text("x")
    proc = run_cli([f"{azurite.account_url}/whatever", str(tmp_path / "file")], env)
    assert proc.returncode == 1
    assert "not a folder" in proc.stderr


async def test_a_blob_deleted_mid_download_fails_alone(azurite, tree, tmp_path):
    """In-process against Azurite: the large blob is deleted while its parts are in flight."""
    deleted = False

    async def before(name: str, start: int) -> None:
        nonlocal deleted
        if name == "big/large.bin" and start >= 10 * PART and not deleted:
            deleted = True
            await trio.to_thread.run_sync(azurite.delete_blob, tree, name)

    @asynccontextmanager
    async def opener():
        client = AzureStorageClient(azurite.account_url, tree, azurite.credential())
        try:
            yield Hooked(client, before)
        finally:
            await client.aclose()

    dest = tmp_path / "dest"
    config = DownloadConfig(dest=dest, transfers=4, part_size=PART)
    spec = parse_source(f"{azurite.account_url}/{tree}")
    run = functools.partial(download, load_settings({}), spec, config, False, opener)
    outcome = await run()
    result = outcome.result
    assert deleted
    assert [f.blob for f in result.failures] == ["big/large.bin"]
    assert "not found" in result.failures[0].reason
    expected = {k: v for k, v in TREE.items() if k != "big/large.bin"}
    assert assert_no_partials(dest, TREE) == expected
