"""Mount options through a real mount: other users, ownership and modes, kernel page cache."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import uuid

import pytest

from blobmount.runstate import stats_socket
from blobmount.stats import fetch_stats
from blobmount.testing.pattern import pattern_bytes

pytestmark = [pytest.mark.fuse, pytest.mark.azurite]

NOBODY = 65534


@pytest.fixture(scope="module")
def container(azurite):
    name = f"opts-{uuid.uuid4().hex[:8]}"
    azurite.create_container(name)
    azurite.upload_many(name, [("data/x.bin", pattern_bytes("x", 0, 5 * 1024 * 1024))])
    return name


def read_as(uid: int, path) -> subprocess.CompletedProcess[bytes]:
    def drop() -> None:
        os.setgid(uid)
        os.setuid(uid)

    # a system binary: the test's own Python may live where `nobody` cannot go
    return subprocess.run(
        ["head", "-c", "100", str(path)], preexec_fn=drop, capture_output=True, check=False
    )


@pytest.fixture
def traversable_tmp(tmp_path):
    # pytest's tmp dirs are 0700: let another user walk down to the mount point
    for parent in [tmp_path, *tmp_path.parents]:
        if str(parent) == "/":
            break
        os.chmod(parent, os.stat(parent).st_mode | 0o011)
    return tmp_path


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_other_users_need_allow_other(container, mount_factory, traversable_tmp):
    private = mount_factory(container, name="private").mountpoint
    shared = mount_factory(container, args=("--allow-other",), name="shared").mountpoint
    assert read_as(NOBODY, private / "data/x.bin").returncode != 0
    done = read_as(NOBODY, shared / "data/x.bin")
    assert done.returncode == 0, done.stderr
    assert done.stdout == pattern_bytes("x", 0, 100)


def test_ownership_and_modes_are_presented_as_asked(container, mount_factory):
    env = {"DATASET_MOUNT_DIR_MODE": "0550"}
    args = ("--uid", "1234", "--gid", "4321", "--file-mode", "0440")
    mnt = mount_factory(container, env=env, args=args).mountpoint
    st = os.stat(mnt / "data/x.bin")
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (1234, 4321, 0o440)
    assert os.stat(mnt / "data").st_mode & 0o777 == 0o550
    assert st.st_size == 5 * 1024 * 1024


def test_second_read_of_unchanged_file_is_served_by_the_kernel(container, mount_factory):
    daemon = mount_factory(container, env={"DATASET_MOUNT_MEMORY_CACHE_SIZE": "0"})
    path = daemon.mountpoint / "data/x.bin"
    expected = pattern_bytes("x", 0, 5 * 1024 * 1024)
    assert path.read_bytes() == expected
    before = fetch_stats(stats_socket(daemon.mountpoint))
    assert path.read_bytes() == expected  # a new open of the same version
    after = fetch_stats(stats_socket(daemon.mountpoint))
    assert after["storage"]["range_requests"] == before["storage"]["range_requests"]
    assert after["blocks"]["reads"] == before["blocks"]["reads"]  # no read reached the daemon


def test_stats_channel_is_not_in_the_namespace(container, mount_factory):
    mnt = mount_factory(container).mountpoint
    found = [os.path.join(root, n) for root, dirs, files in os.walk(mnt) for n in dirs + files]
    assert sorted(os.path.relpath(p, mnt) for p in found) == ["data", "data/x.bin"]
    assert not str(stats_socket(mnt)).startswith(str(mnt))


@pytest.mark.skipif(os.geteuid() != 0, reason="raising a device's read-ahead needs root")
@pytest.mark.parametrize(
    ("setting", "request_kib"), [(None, 1024), ("4MB", 1024), ("256KB", 256), ("0", 128)]
)
def test_kernel_read_ahead_sets_the_size_of_the_kernels_reads(
    container, mount_factory, setting, request_kib
):
    # the kernel's own default is 128 KiB; its FUSE requests are never larger than 1 MiB
    env = {} if setting is None else {"DATASET_MOUNT_KERNEL_READ_AHEAD": setting}
    daemon = mount_factory(container, env=env)
    expected = pattern_bytes("x", 0, 5 * 1024 * 1024)
    with open(daemon.mountpoint / "data/x.bin", "rb", buffering=0) as f:
        data = b"".join(iter(lambda: f.read(1024 * 1024), b""))
    assert data == expected
    stats = fetch_stats(stats_socket(daemon.mountpoint))["blocks"]
    assert stats["bytes_served"] == len(expected)
    assert stats["reads"] == len(expected) // (request_kib * 1024)
    if setting != "0":
        assert "kernel read-ahead of" in daemon.log()


@pytest.fixture(scope="module")
def small_files_container(azurite):
    name = f"smallbg-{uuid.uuid4().hex[:8]}"
    azurite.create_container(name)
    azurite.upload_many(
        name, [(f"s/{i:04d}.bin", pattern_bytes(f"s{i}", 0, 20_000 + 37 * i)) for i in range(240)]
    )
    return name


def connection_dir(mountpoint) -> str:
    return f"/sys/fs/fuse/connections/{os.minor(os.stat(mountpoint).st_dev)}"


@pytest.mark.skipif(os.geteuid() != 0, reason="raising a FUSE connection's limits needs root")
def test_many_readers_of_small_files_get_each_file_in_one_request(
    small_files_container, mount_factory
):
    # With the kernel's limit of 12 background requests, a dozen readers congest the mount and
    # the kernel then reads a page at a time (5-7 requests for a 25 KB file; measured 2.3-2.7 per
    # file on average with 16 readers). The daemon raises the limit to 64.
    daemon = mount_factory(small_files_container)
    conn = connection_dir(daemon.mountpoint)
    with open(f"{conn}/max_background") as f:
        assert f.read().strip() == "64"
    with open(f"{conn}/congestion_threshold") as f:
        assert f.read().strip() == "48"
    assert "FUSE background requests of" in daemon.log()

    def read(i: int) -> bool:
        with open(daemon.mountpoint / f"s/{i:04d}.bin", "rb", buffering=0) as f:
            return f.read(1024 * 1024) == pattern_bytes(f"s{i}", 0, 20_000 + 37 * i)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert all(pool.map(read, range(240)))
    stats = fetch_stats(stats_socket(daemon.mountpoint))["blocks"]
    assert stats["reads"] == 240


@pytest.mark.skipif(os.geteuid() != 0, reason="raising a FUSE connection's limits needs root")
def test_kernel_max_background_zero_leaves_the_kernel_default(small_files_container, mount_factory):
    daemon = mount_factory(small_files_container, env={"DATASET_MOUNT_KERNEL_MAX_BACKGROUND": "0"})
    conn = connection_dir(daemon.mountpoint)
    if os.path.isdir(conn):  # fusectl is mounted (the default mounts it): the kernel's 12
        with open(f"{conn}/max_background") as f:
            assert f.read().strip() == "12"
    assert "FUSE background requests" not in daemon.log()
