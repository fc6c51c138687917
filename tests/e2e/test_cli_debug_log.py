"""`--debug` and `-v` as a user runs them: `blobmount mount --debug` logs one line per storage
request (with both request ids, without secrets), `-v` does not, and the flags win over
DATASET_MOUNT_LOG_LEVEL; the same for `download`, with the flag before the command."""

from __future__ import annotations

import re
import subprocess
import uuid

import pytest

from tests.helpers.daemon_calls import blobmount
from tests.helpers.mount import is_mounted

pytestmark = [pytest.mark.fuse, pytest.mark.azurite]

#: a request line as the text log shows it (after "<time> DEBUG   <logger>: ")
REQUEST = re.compile(
    r"blobmount\.storage\.request_log: (?P<method>GET|HEAD) (?P<path>\S+)( list)?"
    r"(?: range=(?P<range>\d+-\d+))? status=(?P<status>\d{3}) ms=\d+\.\d (?:bytes=\d+ )?"
    r"x-ms-client-request-id=(?P<client>[0-9a-f-]{36}) x-ms-request-id=(?P<server>\S+)$"
)
LOGGER = "blobmount.storage.request_log:"


def request_lines(text: str) -> list[re.Match[str]]:
    lines = [line for line in text.splitlines() if LOGGER in line]
    matches = [REQUEST.search(line) for line in lines]
    assert all(matches), lines
    return [m for m in matches if m is not None]


@pytest.fixture
def source(azurite):
    name = f"dbg-{uuid.uuid4().hex[:8]}"
    azurite.create_container(name)
    azurite.upload_many(name, [("a/one.txt", b"one"), ("two.txt", b"two" * 1000)])
    return f"{azurite.account_url}/{name}", f"{azurite.account}/{name}"


@pytest.fixture
def mountpoint(tmp_path, fuse_ok):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    yield mnt
    if is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)


def _mount_read_unmount(args: list[str], mountpoint, env, log_file) -> str:
    done = blobmount(*args, "--log-file", str(log_file), env=env)
    assert done.returncode == 0, done.stderr
    try:
        assert (mountpoint / "two.txt").read_bytes() == b"two" * 1000
    finally:
        done = blobmount("unmount", str(mountpoint), env=env)
    assert done.returncode == 0, done.stderr
    return log_file.read_text()


def test_mount_debug_logs_each_storage_request(azurite, source, mountpoint, mount_env, tmp_path):
    uri, where = source
    text = _mount_read_unmount(
        ["mount", "--debug", uri, str(mountpoint)], mountpoint, mount_env, tmp_path / "d.log"
    )
    lines = request_lines(text)
    # the listing the mount starts with, and the ranged GET of the file read
    assert any(m["path"] == f"{where}/" and m["status"] == "200" for m in lines), text
    reads = [m for m in lines if m["path"] == f"{where}/two.txt" and m["method"] == "GET"]
    assert reads, text
    assert reads[0]["status"] in ("200", "206")
    assert reads[0]["range"]
    assert all(m["server"] != "-" for m in lines)
    clients = [m["client"] for m in lines]
    assert len(set(clients)) == len(clients)  # no call here sends two requests
    assert azurite.account_key not in text
    assert "?" not in "".join(m["path"] for m in lines)


def test_verbose_wins_over_a_debug_variable_and_logs_no_requests(
    source, mountpoint, mount_env, tmp_path
):
    uri, _ = source
    env = {**mount_env, "DATASET_MOUNT_LOG_LEVEL": "DEBUG"}
    text = _mount_read_unmount(
        ["mount", "-v", uri, str(mountpoint)], mountpoint, env, tmp_path / "v.log"
    )
    assert " INFO " in text
    assert " DEBUG " not in text
    assert LOGGER not in text


def test_download_debug_before_the_command_logs_requests_to_stderr(
    azurite, source, mount_env, tmp_path
):
    uri, where = source
    env = {**mount_env, "XDG_STATE_HOME": str(tmp_path / "state")}
    done = blobmount("--debug", "download", uri, str(tmp_path / "d"), "--no-progress", env=env)
    assert done.returncode == 0, done.stderr
    paths = {m["path"] for m in request_lines(done.stderr)}
    assert {f"{where}/", f"{where}/a/one.txt", f"{where}/two.txt"} <= paths
    assert azurite.account_key not in done.stderr

    done = blobmount("download", "-v", uri, str(tmp_path / "e"), "--no-progress", env=env)
    assert done.returncode == 0, done.stderr
    assert LOGGER not in done.stderr


def test_warm_debug_on_a_uri_reaches_the_temporary_mount(
    azurite, source, mount_env, tmp_path, fuse_ok
):
    uri, where = source
    env = {**mount_env, "XDG_STATE_HOME": str(tmp_path / "state")}
    done = blobmount("warm", "--debug", uri, "--no-progress", env=env)
    assert done.returncode == 0, done.stderr
    # the temporary mount's daemon logged to its default file, under the state folder
    logs = list((tmp_path / "state" / "blobmount" / "logs").glob("*.log"))
    assert len(logs) == 1, logs
    paths = {m["path"] for m in request_lines(logs[0].read_text())}
    assert f"{where}/two.txt" in paths
