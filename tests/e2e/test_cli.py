"""The `blobmount` command as a user runs it: background mount, unmount, errors and their exit
statuses, secrets."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.helpers.mount import is_mounted

#: PYTHONPATH entry under which host names ending in .invalid do not resolve (no DNS query)
UNRESOLVABLE = Path(__file__).resolve().parents[1] / "helpers" / "unresolvable"

pytestmark = [pytest.mark.fuse, pytest.mark.azurite]


def blobmount(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blobmount", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def small_container(azurite):
    name = f"cli-{uuid.uuid4().hex[:8]}"
    azurite.create_container(name)
    azurite.upload_many(name, [("a/one.txt", b"one"), ("two.txt", b"two" * 1000)])
    return name


@pytest.fixture
def mountpoint(tmp_path, fuse_ok):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    yield mnt
    if is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)


def test_background_mount_is_ready_when_it_returns_and_unmounts(
    azurite, small_container, mountpoint, mount_env, tmp_path
):
    log_file = tmp_path / "daemon.log"
    uri = f"{azurite.account_url}/{small_container}"
    done = blobmount("mount", uri, str(mountpoint), "--log-file", str(log_file), env=mount_env)
    assert done.returncode == 0, done.stderr
    # ready means ready: the very first listing works, no polling
    assert sorted(os.listdir(mountpoint)) == ["a", "two.txt"]
    assert (mountpoint / "a/one.txt").read_bytes() == b"one"
    assert str(log_file) in done.stdout
    pid = int(done.stdout.split("(pid ")[1].split(",")[0])
    assert psutil.pid_exists(pid)

    done = blobmount("unmount", str(mountpoint), env=mount_env)
    assert done.returncode == 0, done.stderr
    assert not is_mounted(mountpoint)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and psutil.pid_exists(pid):
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.05)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert "unmounted" in log_file.read_text()


def _assert_refused(
    done: subprocess.CompletedProcess[str], mountpoint: Path, *words: str, status: int
) -> None:
    """Refused as a product should: the status of its kind, one line naming the cause, no
    traceback, nothing mounted."""
    assert done.returncode == status, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("blobmount: "), done.stderr
    assert "Traceback" not in done.stderr
    message = done.stderr.lower()
    for word in words:
        assert word.lower() in message, done.stderr
    assert not is_mounted(mountpoint)


def test_missing_container_is_refused_before_mounting(azurite, mountpoint, mount_env):
    done = blobmount(
        "mount", f"{azurite.account_url}/no-such-container", str(mountpoint), env=mount_env
    )
    _assert_refused(done, mountpoint, "container not found", "check the container", status=4)


def test_wrong_key_is_refused_before_mounting(azurite, small_container, mountpoint, mount_env):
    env = dict(mount_env)
    wrong = "A" * 86 + "=="
    env["AZURE_STORAGE_CONNECTION_STRING"] = azurite.connection_string.replace(
        azurite.connection_string.split("AccountKey=")[1].split(";")[0], wrong
    )
    done = blobmount("mount", f"{azurite.account_url}/{small_container}", str(mountpoint), env=env)
    _assert_refused(done, mountpoint, "refused the credentials", "check the account key", status=3)
    assert wrong not in done.stderr


def test_unreachable_endpoint_is_refused_before_mounting(mountpoint, mount_env):
    env = dict(mount_env)
    env["AZUREML_DATASET_HTTP_RETRY_COUNT"] = "1"
    env["DATASET_MOUNT_CONNECT_TIMEOUT_SECONDS"] = "2"
    env["AZURE_STORAGE_CONNECTION_STRING"] = env["AZURE_STORAGE_CONNECTION_STRING"].replace(
        "127.0.0.1:",
        "127.0.0.1:1",  # a port nobody listens on
    )
    uri = "http://127.0.0.1:1/devstoreaccount1/data"
    done = blobmount("mount", uri, str(mountpoint), env=env)
    # what was tried (listing the container at that endpoint) and what failed
    _assert_refused(
        done,
        mountpoint,
        "cannot mount http://127.0.0.1:1/devstoreaccount1/data",
        "list devstoreaccount1/data/",
        "127.0.0.1:1 refused the connection",
        status=4,
    )


def test_a_host_name_that_does_not_resolve_is_named(mountpoint, mount_env):
    env = dict(mount_env)
    env["AZUREML_DATASET_HTTP_RETRY_COUNT"] = "0"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(UNRESOLVABLE), env.get("PYTHONPATH")]))
    endpoint = "http://nosuchaccount.invalid:10000/devstoreaccount1"
    env["AZURE_STORAGE_CONNECTION_STRING"] = (
        env["AZURE_STORAGE_CONNECTION_STRING"].split(";BlobEndpoint=")[0]
        + f";BlobEndpoint={endpoint}"
    )
    done = blobmount("mount", f"{endpoint}/data", str(mountpoint), env=env)
    _assert_refused(
        done,
        mountpoint,
        "the host name nosuchaccount.invalid does not resolve",
        "dns",
        status=4,
    )


def test_a_token_that_cannot_be_had_says_what_was_tried(mountpoint, mount_env, tmp_path):
    # no storage credential, an https endpoint: Azure AD. Only the credentials that read this
    # machine's logins are tried (no managed identity endpoint is asked), and there are none.
    env = {k: v for k, v in mount_env.items() if k != "AZURE_STORAGE_CONNECTION_STRING"}
    env["AZURE_TOKEN_CREDENTIALS"] = "dev"
    env["HOME"] = str(tmp_path)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    done = blobmount("mount", "https://127.0.0.1:1/devstoreaccount1/data", str(mountpoint), env=env)
    _assert_refused(
        done,
        mountpoint,
        "could not get a token",
        "the credential chain tried",
        "AzureCliCredential (",
        "AZURE_STORAGE_SAS_TOKEN",
        status=3,
    )


def test_a_forgotten_mount_point_is_named(mount_env, tmp_path):
    sas = "sv=2024-01-01&sig=c2VjcmV0"
    done = blobmount("mount", f"az://datasets/imagenet?{sas}", env=mount_env)
    _assert_refused(
        done, tmp_path, "no mount point given", "blobmount mount URI MOUNTPOINT", status=2
    )
    assert "sig=" not in done.stderr  # the URI is not echoed: it may carry a SAS
    done = blobmount("mount", str(tmp_path), env=mount_env)  # and no URI at all
    _assert_refused(done, tmp_path, "no source URI given", "BLOBMOUNT_SOURCE_URI", status=2)


@pytest.mark.parametrize(
    ("where", "words"),
    [
        ("missing/x.log", ["missing does not exist", "create it"]),
        ("a-file/x.log", ["a-file is not a folder"]),
        ("a-folder", ["is a directory"]),
    ],
)
@pytest.mark.parametrize("given_by", ["--log-file", "DATASET_MOUNT_LOG_FILE"])
def test_a_log_file_that_cannot_be_written_is_refused_before_mounting(
    where, words, given_by, azurite, small_container, mountpoint, mount_env, tmp_path
):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-folder").mkdir()
    log_file = tmp_path / where
    env, args = dict(mount_env), []
    if given_by == "--log-file":
        args = ["--log-file", str(log_file)]
    else:
        env["DATASET_MOUNT_LOG_FILE"] = str(log_file)
    uri = f"{azurite.account_url}/{small_container}"
    for foreground in ([], ["--foreground"]):  # the mount command, and the daemon systemd runs
        done = blobmount("mount", uri, str(mountpoint), *foreground, *args, env=env)
        _assert_refused(done, mountpoint, f"cannot write the log file {log_file}", *words, status=2)
        assert given_by in done.stderr
    assert not (tmp_path / "missing").exists()  # a folder is never made up


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("ftp://example/data", ["ftp"]),
        ("az://", ["container"]),
        ("az://Bad_Container", ["container"]),
        ("https://acct.blob.core.windows.net/c/../x", [".."]),
    ],
)
def test_malformed_uri_is_refused(uri, words, mountpoint, mount_env):
    done = blobmount("mount", uri, str(mountpoint), env=mount_env)
    _assert_refused(done, mountpoint, *words, status=2)


def test_bad_setting_is_refused_with_its_name(azurite, small_container, mountpoint, mount_env):
    env = {**mount_env, "DATASET_MOUNT_READ_BLOCK_SIZE": "lots"}
    done = blobmount("mount", f"{azurite.account_url}/{small_container}", str(mountpoint), env=env)
    _assert_refused(done, mountpoint, "DATASET_MOUNT_READ_BLOCK_SIZE", "lots", status=2)


def test_bad_mount_points_are_refused(azurite, small_container, tmp_path, mount_env, fuse_ok):
    uri = f"{azurite.account_url}/{small_container}"
    missing = tmp_path / "missing"
    done = blobmount("mount", uri, str(missing), env=mount_env)
    _assert_refused(done, missing, "does not exist", status=2)
    full = tmp_path / "full"
    full.mkdir()
    (full / "something").write_text("x")
    done = blobmount("mount", uri, str(full), env=mount_env)
    _assert_refused(done, full, "not empty", status=2)
    done = blobmount("mount", uri, str(full), "--allow-non-empty", env=mount_env)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(full)) == ["a", "two.txt"]
    assert blobmount("unmount", str(full), env=mount_env).returncode == 0


def test_secrets_never_reach_logs_or_ps(azurite, small_container, mountpoint, mount_env, tmp_path):
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    key = azurite.connection_string.split("AccountKey=")[1].split(";")[0]
    sas = generate_container_sas(
        "devstoreaccount1",
        small_container,
        account_key=key,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1),
    )
    signature = next(p for p in sas.split("&") if p.startswith("sig="))[4:]
    env = {k: v for k, v in mount_env.items() if k != "AZURE_STORAGE_CONNECTION_STRING"}
    env["DATASET_MOUNT_LOG_LEVEL"] = "DEBUG"
    log_file = tmp_path / "daemon.log"
    uri = f"{azurite.account_url}/{small_container}?{sas}"
    done = blobmount("mount", uri, str(mountpoint), "--log-file", str(log_file), env=env)
    assert done.returncode == 0, done.stderr
    try:
        assert (mountpoint / "two.txt").read_bytes() == b"two" * 1000
        pid = int(done.stdout.split("(pid ")[1].split(",")[0])
        cmdline = " ".join(psutil.Process(pid).cmdline())
        assert signature not in cmdline
        stats = blobmount("stats", str(mountpoint), "--json", env=env)
        assert stats.returncode == 0
        assert signature not in stats.stdout
    finally:
        blobmount("unmount", str(mountpoint), env=env)
    text = log_file.read_text()
    assert "DEBUG" in text  # the log was verbose, and still clean
    for secret in (signature, key, key[:20]):
        assert secret not in text
        assert secret not in done.stdout + done.stderr


def test_version_and_help(mount_env):
    from blobmount import __version__

    done = blobmount("--version", env=mount_env)
    assert done.returncode == 0
    assert __version__ in done.stdout
    done = blobmount("mount", "--help", env=mount_env)
    assert done.returncode == 0
    assert "--foreground" in done.stdout


def test_config_prints_effective_settings_and_rejects_bad_ones(mount_env):
    env = {**mount_env, "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT": "80"}
    done = blobmount("config", env=env)
    assert done.returncode == 0
    line = next(x for x in done.stdout.splitlines() if "READ_BUFFER_BLOCK_COUNT" in x)
    assert "80" in line
    assert "environment" in line
    done = blobmount("config", env={**env, "DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD": "2"})
    assert done.returncode != 0
    assert "DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD" in done.stderr


def test_an_unknown_variable_is_named_with_the_closest_known_one(mount_env):
    env = {**mount_env, "DATASET_MOUNT_READ_BUFER_BLOCK_COUNT": "80"}
    done = blobmount("config", env=env)
    assert done.returncode == 0
    assert done.stderr == (
        "blobmount: DATASET_MOUNT_READ_BUFER_BLOCK_COUNT is not a blobmount setting and is "
        "ignored; did you mean DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT?\n"
    )
    line = next(x for x in done.stdout.splitlines() if "READ_BUFFER_BLOCK_COUNT" in x)
    assert "(default)" in line  # ignored indeed


def test_config_json_prints_the_effective_settings_with_secrets_masked(azurite, mount_env):
    key = azurite.connection_string.split("AccountKey=")[1].split(";")[0]
    env = {**mount_env, "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT": "80"}
    done = blobmount("config", "--json", env=env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    entry = out["settings"]["DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT"]
    assert entry == {"value": 80, "text": "80", "source": "environment"}
    assert out["settings"]["DATASET_MOUNT_CACHE_DIR"]["value"] == env["DATASET_MOUNT_CACHE_DIR"]
    assert out["credentials"] == {"AZURE_STORAGE_CONNECTION_STRING": "***"}
    assert key not in done.stdout
    assert key[:20] not in done.stdout
