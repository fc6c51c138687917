"""Dataset snapshots against Azurite, through a fault proxy that counts every request: made by
one listing, kept in a blob, mounted with no list request at all; a blob overwritten or deleted
after the snapshot reads as EIO while the others read right; `download` and `warm` follow the
snapshot too; a truncated or corrupt snapshot stops `mount` before anything is mounted.

The CLI runs in subprocesses, as a user runs it.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from blobmount.testing.pattern import pattern_bytes
from tests.helpers.mount import daemon_stats, is_mounted

pytestmark = [pytest.mark.fuse, pytest.mark.azurite]

FILES = {
    "train/c0/a.bin": 300_000,
    "train/c0/b.bin": 5_000,
    "train/c1/x.bin": 3 * 1024 * 1024 + 7,
    "train/c1/y.bin": 100,
    "val/v.bin": 10,
    "top.txt": 12,
}
MARKER = "train/empty"  # a folder marker blob (hdi_isfolder=true)
CHANGED, DELETED = "train/c0/a.bin", "train/c1/y.bin"


def blobmount(*args: object, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blobmount", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def content(name: str) -> bytes:
    return pattern_bytes(name, 0, FILES[name])


def lists(proxy) -> int:
    return proxy.counts("list").get("requests", 0)


@pytest.fixture
def dataset(azurite, container) -> str:
    azurite.upload_many(container, [(name, content(name)) for name in FILES])
    azurite.upload_folder_marker(container, MARKER)
    return container


@pytest.fixture
def snapshots(azurite) -> Iterator[str]:
    """A second container, for snapshot blobs."""
    name = f"snaps-{uuid.uuid4().hex[:8]}"
    azurite.create_container(name)
    try:
        yield name
    finally:
        azurite.delete_container(name)


def _walk(root: Path) -> dict[str, int]:
    return {
        os.path.relpath(os.path.join(folder, name), root): os.stat(
            os.path.join(folder, name)
        ).st_size
        for folder, _, names in os.walk(root)
        for name in names
    }


def test_a_mount_from_a_snapshot_never_lists_and_pins_every_read(
    azurite, dataset, snapshots, proxy, mount_factory, mount_env, tmp_path
):
    env = {**mount_env, "XDG_STATE_HOME": str(tmp_path / "state")}
    source = proxy.url(dataset)
    snapshot = f"{proxy.url(snapshots)}/imagenet/v1.bmsnap"

    made = blobmount("snapshot", "create", source, snapshot, "--json", env=env)
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    assert created["entries"] == len(FILES) + 1
    assert created["total_bytes"] == sum(FILES.values())
    assert created["list_requests"] == 1
    assert lists(proxy) == 1  # one flat listing, whatever the folders
    shown = blobmount("snapshot", "show", snapshot, env=env)
    assert shown.returncode == 0, shown.stderr
    assert f"entries:   {len(FILES) + 1}" in shown.stdout
    assert source in shown.stdout

    daemon = mount_factory(dataset, base_url=proxy.account_url, args=("--snapshot", snapshot))
    root = daemon.mountpoint
    assert _walk(root) == FILES
    assert (root / MARKER).is_dir()
    for name in set(FILES) - {CHANGED, DELETED}:
        assert (root / name).read_bytes() == content(name), name

    # the dataset changes under the job: one blob rewritten, one deleted, one added
    azurite.upload(dataset, CHANGED, b"other bytes entirely")
    azurite.delete_blob(dataset, DELETED)
    azurite.upload(dataset, "train/c0/new.bin", b"new")
    for name in (CHANGED, DELETED):
        with pytest.raises(OSError) as info:
            (root / name).read_bytes()
        assert info.value.errno == errno.EIO, name
    assert os.stat(root / CHANGED).st_size == FILES[CHANGED]  # as recorded
    assert not (root / "train/c0/new.bin").exists()
    assert sorted(os.listdir(root / "train/c0")) == ["a.bin", "b.bin"]
    assert (root / "train/c1/x.bin").read_bytes() == content("train/c1/x.bin")

    assert lists(proxy) == 1  # not one list request since the snapshot was made
    assert daemon_stats(daemon)["storage"]["list_requests"] == 0
    log = daemon.log()
    assert f"blob {CHANGED} changed since the snapshot" in log
    assert f"blob {DELETED} was deleted since the snapshot" in log

    # download follows the snapshot too: the recorded blobs, never the new bytes
    dest = tmp_path / "copy"
    copied = blobmount("download", source, dest, "--snapshot", snapshot, "--no-progress", env=env)
    assert copied.returncode == 1, copied.stderr  # two blobs could not be copied
    assert _walk(dest) == {n: s for n, s in FILES.items() if n not in (CHANGED, DELETED)}
    assert lists(proxy) == 1

    # and diff says what changed since
    later = tmp_path / "v2.bmsnap"
    assert blobmount("snapshot", "create", source, later, env=env).returncode == 0
    changes = blobmount("snapshot", "diff", snapshot, later, env=env)
    assert changes.returncode == 0, changes.stderr
    lines = changes.stdout.splitlines()
    assert "+ train/c0/new.bin" in lines
    assert f"- {DELETED}" in lines
    assert any(line.startswith(f"~ {CHANGED} ") for line in lines)
    assert lines[-1] == "blobmount: 1 added, 1 removed, 1 changed"


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_snapshot_is_refused_before_mounting(
    azurite, dataset, mount_env, tmp_path, fuse_ok, damage
):
    uri = f"{azurite.account_url}/{dataset}"
    good = tmp_path / "good.bmsnap"
    assert blobmount("snapshot", "create", uri, good, env=mount_env).returncode == 0
    data = good.read_bytes()
    bad = tmp_path / "bad.bmsnap"
    if damage == "truncated":
        bad.write_bytes(data[: len(data) - 9])
    else:
        bad.write_bytes(data[:60] + bytes([data[60] ^ 0x40]) + data[61:])
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    try:
        refused = blobmount(
            "mount",
            uri,
            mountpoint,
            "--snapshot",
            bad,
            "--log-file",
            tmp_path / "d.log",
            env=mount_env,
        )
        assert refused.returncode == 2, refused.stderr
        assert damage in refused.stderr
        assert str(bad) in refused.stderr
        assert not is_mounted(mountpoint)
        assert os.listdir(mountpoint) == []
    finally:
        if is_mounted(mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)


def test_warm_and_the_python_api_take_a_snapshot(azurite, dataset, mount_env, tmp_path, fuse_ok):
    uri = f"{azurite.account_url}/{dataset}"
    snapshot = tmp_path / "s.bmsnap"
    api = (
        "import sys, blobmount.api as b\n"
        "made = b.create_snapshot(sys.argv[1], sys.argv[2])\n"
        "with b.mount(sys.argv[1], snapshot=sys.argv[2]) as root:\n"
        "    print(made.header.entries, sorted(p.name for p in (root / 'train').iterdir()))\n"
        "print(b.snapshot_info(sys.argv[2]).header.total_bytes)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", api, uri, str(snapshot)],
        env=mount_env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"{len(FILES) + 1} ['c0', 'c1', 'empty']",
        str(sum(FILES.values())),
    ]
    azurite.delete_blob(dataset, DELETED)
    warmed = blobmount(
        "warm", uri, "train", "--snapshot", snapshot, "--json", "--no-progress", env=mount_env
    )
    summary = json.loads(warmed.stdout)
    assert warmed.returncode == 1, warmed.stderr  # the deleted blob failed, as recorded
    assert [f["path"] for f in summary["failures"]] == [DELETED], summary
