"""`blobmount warm` through a real mount of Azurite: a warmed subtree is then read with no
storage requests (also after a remount on the same cache), a cache smaller than the subtree
stops warm before pruning could start, bad PATHs and cacheless mounts are refused, and warm on
a URI mounts, warms and unmounts, also when interrupted. Block mode with the RAM tier off (so
it cannot hide the disk tier), and whole-file mode.

The CLI runs in a subprocess, as a user runs it; the daemon's stats say what reached storage.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from blobmount.testing.pattern import pattern_bytes
from tests.e2e.test_disk_tier import METADATA_SLACK, du, read_file, stats
from tests.helpers.fault_proxy import stall
from tests.helpers.mount import is_mounted
from tests.helpers.single_process import FETCHES_PER_PROCESS

pytestmark = [pytest.mark.fuse, pytest.mark.azurite]

MiB = 1024 * 1024
BLOCK = 2 * MiB  # the default DATASET_MOUNT_READ_BLOCK_SIZE
NO_RAM = {"DATASET_MOUNT_MEMORY_CACHE_SIZE": "0"}
WHOLE = {"DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "false"}

#: 4 files of three blocks (the last one partial) and 20 small ones: about 21 MiB
TRAIN = {f"train/part{i}.bin": 5 * MiB + 1000 * i for i in range(4)} | {
    f"train/small/{i:03d}.jpg": 40_000 + i for i in range(20)
}
OTHER = {"other/x.bin": 2 * MiB, "other/y.bin": 3 * MiB + 1}


def blocks(sizes: dict[str, int]) -> int:
    return sum(-(-size // BLOCK) for size in sizes.values())


@pytest.fixture(scope="module")
def dataset(azurite):
    """(container, {path: sha256}) of TRAIN and OTHER."""
    container = f"warm-{uuid.uuid4().hex[:8]}"
    azurite.create_container(container)
    items = [(name, pattern_bytes(name, 0, size)) for name, size in (TRAIN | OTHER).items()]
    azurite.upload_many(container, items, threads=4)
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in items}
    del items
    try:
        yield container, digests
    finally:
        azurite.delete_container(container)


def run_warm(*args: object, env: dict[str, str], as_json: bool = True):
    """`blobmount warm ARGS`: (the process, its JSON summary or None)."""
    cmd = [sys.executable, "-m", "blobmount", "warm", *map(str, args)]
    if as_json:
        cmd.append("--json")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    doc = json.loads(proc.stdout) if as_json and proc.returncode in (0, 130) else None
    return proc, doc


def read_all(mountpoint: Path, digests: dict[str, str], names) -> None:
    for name in names:
        # the read must reach the daemon: pages dropped through the reading handle (an open of
        # its own would start a one-block file's GET for nothing)
        assert read_file(mountpoint / name, drop_pages=True)[0] == digests[name], name


# -- block mode ---------------------------------------------------------------------------------


@FETCHES_PER_PROCESS
def test_warm_fills_the_disk_cache_and_reads_then_make_no_storage_requests(dataset, mount_factory):
    container, digests = dataset
    daemon = mount_factory(container, env=NO_RAM)
    proc, doc = run_warm(daemon.mountpoint, "train", env=daemon.env)
    assert proc.returncode == 0, proc.stderr
    assert (doc["files"], doc["bytes"]) == (len(TRAIN), sum(TRAIN.values()))
    assert doc["mode"] == "block"
    assert doc["cache_full"] is False
    assert doc["blocks_not_written"] == 0
    assert doc["bytes_from_storage"] == sum(TRAIN.values())

    # warm returned: its blocks are on disk, not in the write queue; other/ was not read
    s1 = stats(daemon)
    disk = s1["disk"]
    assert disk["writer"]["queued_blocks"] == 0
    assert disk["space"]["entries"] == blocks(TRAIN)
    assert s1["storage"]["range_bytes"] == sum(TRAIN.values())

    read_all(daemon.mountpoint, digests, TRAIN)
    s2 = stats(daemon)
    assert s2["storage"]["range_requests"] == s1["storage"]["range_requests"]
    assert s2["disk"]["hits"] - s1["disk"]["hits"] == blocks(TRAIN)
    assert s2["blocks"]["bytes_served"] - s1["blocks"]["bytes_served"] >= sum(TRAIN.values())
    print(f"\nwarm of {len(TRAIN)} files: {doc['bytes_per_s'] / MiB:.0f} MiB/s")


@FETCHES_PER_PROCESS
def test_a_remount_after_warm_reads_nothing_from_storage(dataset, mount_factory):
    container, digests = dataset
    first = mount_factory(container, env=NO_RAM)
    proc, doc = run_warm(first.mountpoint, env=first.env)  # no PATH: the whole mount
    assert proc.returncode == 0, proc.stderr
    assert doc["files"] == len(TRAIN) + len(OTHER)
    first.stop()

    second = mount_factory(container, env=NO_RAM, name="again")
    read_all(second.mountpoint, digests, TRAIN | OTHER)
    s = stats(second)
    assert s["storage"]["range_requests"] == 0
    assert s["disk"]["hits"] == blocks(TRAIN | OTHER)


@FETCHES_PER_PROCESS
def test_a_cache_smaller_than_the_subtree_stops_warm_before_pruning(dataset, mount_factory):
    container, _ = dataset
    limit = 14 * MiB  # two of the 5 MiB parts, not three
    env = {**NO_RAM, "DATASET_MOUNT_CACHE_SIZE": "14MB"}
    daemon = mount_factory(container, env=env)
    cache = Path(daemon.env["DATASET_MOUNT_CACHE_DIR"])
    proc, _ = run_warm(daemon.mountpoint, "train", env=daemon.env, as_json=False)
    assert proc.returncode == 0, proc.stderr
    assert "blobmount: warmed 2 files" in proc.stdout
    assert "the cache is full: stopped before train/part2.bin" in proc.stdout
    space = stats(daemon)["disk"]["space"]
    assert space["used_bytes"] < space["prune_start_bytes"] == limit
    assert space["prune_runs"] == space["pruned_entries"] == 0
    assert du(cache) <= limit + METADATA_SLACK

    # a rerun finds the two parts cached (without reading them again), and stops again
    proc, doc = run_warm(daemon.mountpoint, "train", env=daemon.env)
    assert proc.returncode == 0, proc.stderr
    assert (doc["files"], doc["files_already_cached"]) == (0, 2)
    assert doc["cache_full"] is True
    assert doc["bytes_from_storage"] <= BLOCK  # at most the one block it checked and lacked
    s = stats(daemon)
    space = s["disk"]["space"]
    assert space["used_bytes"] < space["prune_start_bytes"]
    assert space["prune_runs"] == space["pruned_entries"] == 0
    assert s["disk"]["writer"]["dropped_no_space"] == 0
    assert du(cache) <= limit + METADATA_SLACK


def test_bad_paths_and_mounts_without_a_disk_cache_are_refused(dataset, mount_factory, tmp_path):
    container, _ = dataset
    daemon = mount_factory(container, env=NO_RAM)
    mnt = daemon.mountpoint
    for args, message in [
        ((mnt, "/etc"), "/etc is outside the mount"),
        ((mnt, "train", "../elsewhere"), "../elsewhere is outside the mount"),
        ((mnt, "train/nope.bin"), "train/nope.bin: no such file or folder in the mount"),
        ((tmp_path,), "is not a live blobmount mount"),
    ]:
        proc, _ = run_warm(*args, env=daemon.env)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
    assert stats(daemon)["storage"]["range_requests"] == 0

    cacheless = mount_factory(container, env={"DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED": "false"})
    proc, _ = run_warm(cacheless.mountpoint, env=cacheless.env)
    assert proc.returncode == 1
    assert "keeps no cache on disk" in proc.stderr
    assert stats(cacheless)["storage"]["range_requests"] == 0


# -- on a URI -----------------------------------------------------------------------------------


def test_warm_on_a_uri_mounts_warms_and_unmounts(dataset, azurite, mount_env, mount_factory):
    container, digests = dataset
    env = {**mount_env, **NO_RAM}
    proc, doc = run_warm(f"{azurite.account_url}/{container}", "train", env=env)
    assert proc.returncode == 0, proc.stderr
    assert doc["files"] == len(TRAIN)
    used = Path(doc["mountpoint"])
    assert not is_mounted(used)
    assert not used.exists()  # the temporary folder is gone too

    daemon = mount_factory(container, env=NO_RAM)  # same cache folder (mount_env)
    read_all(daemon.mountpoint, digests, TRAIN)
    assert stats(daemon)["storage"]["range_requests"] == 0


def test_an_interrupted_warm_on_a_uri_leaves_no_mount_behind(
    dataset, proxy, mount_env, fuse_ok, tmp_path
):
    container, _ = dataset
    proxy.set_fault(stall())  # every range GET waits until released
    err = tmp_path / "warm.err"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "blobmount", "warm", proxy.url(container), "train", "--json"],
            env={**mount_env, **NO_RAM},
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        assert proxy.wait_until(lambda p: p.stalled >= 1, timeout_s=60), err.read_text()
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        while "SIGINT: stopping" not in err.read_text():  # it took the signal; reads still held
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        proxy.clear()
        out, _ = proc.communicate(timeout=120)
    finally:
        proxy.clear()
        _stop_warm(proc, err.read_text())
    assert proc.returncode == 130, err.read_text()
    doc = json.loads(out)
    assert doc["interrupted"] == "SIGINT"
    assert doc["files"] < len(TRAIN)
    assert not is_mounted(Path(doc["mountpoint"]))
    assert not os.path.exists(doc["mountpoint"])


def _stop_warm(proc: subprocess.Popen[str], log: str) -> None:
    """After a failure: stop warm (SIGTERM lets it unmount), and remove its mount if it could
    not."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for line in log.splitlines():
        if line.endswith(" for warming"):
            mountpoint = Path(line.rsplit(" at ", 1)[1].removesuffix(" for warming"))
            if is_mounted(mountpoint):
                subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)


# -- whole-file mode ----------------------------------------------------------------------------


@FETCHES_PER_PROCESS
def test_whole_file_mode_warm_then_reads_and_a_remount_make_no_storage_requests(
    dataset, mount_factory
):
    container, digests = dataset
    daemon = mount_factory(container, env=WHOLE)
    proc, doc = run_warm(daemon.mountpoint, "train", env=daemon.env)
    assert proc.returncode == 0, proc.stderr
    assert doc["mode"] == "whole-file"
    assert (doc["files"], doc["files_already_cached"]) == (len(TRAIN), 0)
    s1 = stats(daemon)
    assert s1["whole_file"]["downloads"] == len(TRAIN)

    read_all(daemon.mountpoint, digests, TRAIN)
    s2 = stats(daemon)
    assert s2["storage"]["range_requests"] == s1["storage"]["range_requests"]
    assert s2["whole_file"]["downloads"] == len(TRAIN)

    proc, doc = run_warm(daemon.mountpoint, "train", env=daemon.env)  # again: all cached
    assert (doc["files"], doc["files_already_cached"]) == (len(TRAIN), len(TRAIN))
    assert doc["bytes_from_storage"] == 0
    daemon.stop()

    again = mount_factory(container, env=WHOLE, name="again")
    read_all(again.mountpoint, digests, TRAIN)
    s = stats(again)
    assert s["storage"]["range_requests"] == 0
    assert s["whole_file"]["downloads"] == 0


@FETCHES_PER_PROCESS
def test_whole_file_mode_warm_stops_before_pruning(dataset, mount_factory):
    container, _ = dataset
    daemon = mount_factory(container, env={**WHOLE, "DATASET_MOUNT_CACHE_SIZE": "14MB"})
    proc, doc = run_warm(daemon.mountpoint, "train", env=daemon.env)
    assert proc.returncode == 0, proc.stderr
    assert doc["cache_full"] is True
    assert (doc["files"], doc["stopped_before"]) == (2, "train/part2.bin")
    space = stats(daemon)["whole_file"]["space"]
    assert space["used_bytes"] < space["prune_start_bytes"]
    assert space["prune_runs"] == space["pruned_entries"] == 0
