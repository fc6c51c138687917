"""The disk tier through a real mount of Azurite: second reads and remounts served from disk,
damaged cache files refetched, a cache on a small tmpfs kept within its bounds, a disk filled by
someone else, a daemon killed mid-write, and `blobmount cache info|clear` next to live mounts.

The RAM tier is off in these tests (DATASET_MOUNT_MEMORY_CACHE_SIZE=0) so it cannot hide the
disk tier, and the kernel's page cache is dropped for the file (POSIX_FADV_DONTNEED) before a
read that must reach the daemon; `blocks.bytes_served` proves it did.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from blobmount.cachedir.layout import TEMP_PREFIX, CacheLayout
from blobmount.testing.pattern import pattern_bytes
from tests.helpers.mount import daemon_stats as stats
from tests.helpers.page_cache import drop_page_cache
from tests.helpers.page_cache import drop_pages as drop_fd_pages
from tests.helpers.single_process import FETCHES_PER_PROCESS, PROCESSES

pytestmark = [pytest.mark.fuse, pytest.mark.azurite]

MiB = 1024 * 1024
BLOCK = 2 * MiB  # the default DATASET_MOUNT_READ_BLOCK_SIZE
BIG = 200 * MiB
MEDIUM = 32 * MiB
QUARTER = 128 * MiB
NO_RAM = {"DATASET_MOUNT_MEMORY_CACHE_SIZE": "0"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def dataset(azurite):
    """big.bin (200 MiB), medium.bin (32 MiB) and part0..3.bin (128 MiB each, 512 MiB in all)."""
    container = f"disk-{uuid.uuid4().hex[:8]}"
    azurite.create_container(container)
    big = pattern_bytes("big", 0, BIG)
    medium = pattern_bytes("medium", 0, MEDIUM)
    quarter = pattern_bytes("quarter", 0, QUARTER)
    azurite.upload_many(
        container,
        [("big.bin", big), ("medium.bin", medium)]
        + [(f"parts/part{i}.bin", quarter) for i in range(4)],
        threads=3,
    )
    digests = {"big.bin": sha(big), "medium.bin": sha(medium), "quarter": sha(quarter)}
    del big, medium, quarter
    try:
        yield container, digests
    finally:
        azurite.delete_container(container)


@pytest.fixture
def cache_dir(tmp_path) -> Path:
    return tmp_path / "cache"


def wait_written(daemon, timeout_s: float = 120.0, blocks: int | None = None) -> dict:
    """Stats once the disk tier's write queue is empty (and, given `blocks`, once that many
    writes have finished: a block taken off the queue may still be being written)."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = stats(daemon)
        writer = s["disk"]["writer"]
        if writer["queued_blocks"] == 0 and (blocks is None or writer["written"] >= blocks):
            return s
        if time.monotonic() > deadline:
            raise AssertionError(f"disk writes still queued after {timeout_s}s: {s['disk']}")
        time.sleep(0.05)


def read_file(path: Path, *, drop_pages: bool = False) -> tuple[str, float]:
    """(sha256, seconds) of reading the whole file through a new handle; `drop_pages`: its
    pages are dropped from the kernel's cache first, through that handle, so the reads reach
    the daemon."""
    h = hashlib.sha256()
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        if drop_pages:
            drop_fd_pages(f.fileno())
        while chunk := f.read(MiB):
            h.update(chunk)
    return h.hexdigest(), time.perf_counter() - started


def blocks_of(size: int) -> int:
    return -(-size // BLOCK)


def mount_with_cache(mount_factory, container, cache_dir, name=None, **env):
    return mount_factory(
        container, env={**NO_RAM, "DATASET_MOUNT_CACHE_DIR": str(cache_dir), **env}, name=name
    )


# -- reads from disk ----------------------------------------------------------------------------


@FETCHES_PER_PROCESS
def test_second_read_comes_from_disk(dataset, mount_factory, cache_dir):
    container, digests = dataset
    daemon = mount_with_cache(mount_factory, container, cache_dir)
    path = daemon.mountpoint / "big.bin"

    digest, first_s = read_file(path)
    assert digest == digests["big.bin"]
    s1 = wait_written(daemon, blocks=blocks_of(BIG))
    assert s1["disk"]["writer"]["written"] == blocks_of(BIG), s1["disk"]
    # every block fetched once (read-ahead fetches adjacent blocks together)
    assert s1["storage"]["range_bytes"] == BIG
    assert s1["storage"]["range_requests"] <= blocks_of(BIG)

    drop_page_cache(path)
    digest, second_s = read_file(path)
    assert digest == digests["big.bin"]
    s2 = stats(daemon)
    assert s2["storage"]["range_requests"] == s1["storage"]["range_requests"]
    # the daemon did serve the second read (the kernel's page cache did not)
    assert s2["blocks"]["bytes_served"] - s1["blocks"]["bytes_served"] >= BIG
    assert s2["disk"]["hits"] - s1["disk"]["hits"] == blocks_of(BIG)
    print(
        f"\n200 MiB: first read (Azurite) {BIG / MiB / first_s:.0f} MiB/s, "
        f"second read (disk tier) {BIG / MiB / second_s:.0f} MiB/s"
    )


@FETCHES_PER_PROCESS
def test_remount_on_the_same_cache_reads_nothing_from_storage(dataset, mount_factory, cache_dir):
    container, digests = dataset
    first = mount_with_cache(mount_factory, container, cache_dir)
    assert read_file(first.mountpoint / "medium.bin")[0] == digests["medium.bin"]
    wait_written(first)
    first.stop()

    second = mount_with_cache(mount_factory, container, cache_dir, name="again")
    digest, seconds = read_file(second.mountpoint / "medium.bin")
    assert digest == digests["medium.bin"]
    s = stats(second)
    assert s["storage"]["range_requests"] == 0
    assert s["disk"]["hits"] == blocks_of(MEDIUM)
    assert s["disk"]["space"]["entries"] == blocks_of(MEDIUM)
    print(f"\nremount: 32 MiB from the disk tier at {MEDIUM / MiB / seconds:.0f} MiB/s")


def test_cached_small_files_are_read_in_place_and_right(azurite, mount_factory, cache_dir):
    # small blocks come back from the disk tier on the event loop (blocks.inline_reads); the
    # bytes must be the same as through a worker thread, and nothing goes to storage
    container = f"small-{uuid.uuid4().hex[:8]}"
    azurite.create_container(container)
    files = {f"img/{i:03d}.jpg": pattern_bytes(f"small{i}", 0, 20_000 + 37 * i) for i in range(60)}
    azurite.upload_many(container, list(files.items()), threads=8)
    try:
        first = mount_with_cache(mount_factory, container, cache_dir)
        for name, data in files.items():
            assert (first.mountpoint / name).read_bytes() == data
        wait_written(first, blocks=len(files))
        first.stop()

        second = mount_with_cache(mount_factory, container, cache_dir, name="again")
        for name, data in files.items():
            assert (second.mountpoint / name).read_bytes() == data
        s = stats(second)
        assert s["storage"]["range_requests"] == 0
        assert s["disk"]["hits"] == len(files)
        assert s["disk"]["inline"]["reads"] + s["disk"]["inline"]["slow_reads"] >= 1
        # every hit read in place unless a read was slow (then some went to threads)
        if s["disk"]["inline"]["slow_reads"] == 0:
            assert s["disk"]["inline"]["reads"] == len(files)
    finally:
        azurite.delete_container(container)


@FETCHES_PER_PROCESS
def test_damaged_cache_files_are_detected_and_refetched(dataset, mount_factory, cache_dir):
    container, digests = dataset
    daemon = mount_with_cache(mount_factory, container, cache_dir)
    path = daemon.mountpoint / "medium.bin"
    assert read_file(path)[0] == digests["medium.bin"]
    s1 = wait_written(daemon)

    files = sorted(Path(e.path) for e in CacheLayout(cache_dir).entries())
    assert len(files) == blocks_of(MEDIUM)
    truncated, flipped = files[3], files[7]
    os.truncate(truncated, truncated.stat().st_size // 2)
    raw = bytearray(flipped.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    raw[len(raw) // 2 + 1] ^= 0x55
    flipped.write_bytes(bytes(raw))

    drop_page_cache(path)
    assert read_file(path)[0] == digests["medium.bin"]
    s2 = wait_written(daemon)
    assert s2["disk"]["corrupt"] == 2
    # exactly the two damaged blocks are fetched again: in one request when they happen to be
    # neighbours (the fetcher joins adjacent missing blocks), else in two
    assert s2["storage"]["range_bytes"] - s1["storage"]["range_bytes"] == 2 * BLOCK
    assert s2["storage"]["range_requests"] - s1["storage"]["range_requests"] in (1, 2)
    assert s2["disk"]["writer"]["written"] - s1["disk"]["writer"]["written"] == 2

    # refilled: a third read is all from disk again
    drop_page_cache(path)
    assert read_file(path)[0] == digests["medium.bin"]
    s3 = stats(daemon)
    assert s3["storage"]["range_requests"] == s2["storage"]["range_requests"]
    assert s3["disk"]["corrupt"] == 2


# -- space ------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MiB tmpfs, unmounted at teardown (lazily if something still holds it). Request it
    before `mount_factory`, so the mounts using it are stopped first."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], check=False)


def du(path: Path) -> int:
    """Bytes allocated under `path`, as `du` counts them: each inode once (a walk that races a
    rename can meet one file under its temporary and its final name)."""
    seen: dict[tuple[int, int], int] = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return sum(seen.values())


class Sampler(threading.Thread):
    """Samples the cache's size and the disk's free space every few milliseconds."""

    def __init__(self, cache: Path, disk: Path) -> None:
        super().__init__(daemon=True)
        self.cache, self.disk = cache, disk
        self.max_du = 0
        self.min_free = 1 << 62
        self.samples = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.max_du = max(self.max_du, du(self.cache))
            st = os.statvfs(self.disk)
            self.min_free = min(self.min_free, st.f_bavail * st.f_frsize)
            self.samples += 1
            time.sleep(0.005)

    def stop(self) -> None:
        self.done.set()
        self.join()


#: CACHEDIR.TAG, the lock files and LOCATION (4 KiB each on tmpfs) are not cache entries
METADATA_SLACK = 64 * 1024


@pytest.mark.parametrize(
    ("cache_size", "limit"),
    [(None, 60 * MiB), ("24MB", 24 * MiB)],
    ids=["unlimited", "absolute"],
)
def test_cache_on_a_small_tmpfs_stays_bounded(
    dataset, small_disk, mount_factory, cache_size, limit
):
    container, digests = dataset
    cache = small_disk / "cache"
    env = {"DATASET_RESERVED_FREE_DISK_SPACE": "4MB"}
    if cache_size is not None:
        env["DATASET_MOUNT_CACHE_SIZE"] = cache_size
    daemon = mount_with_cache(mount_factory, container, cache, **env)
    sampler = Sampler(cache, small_disk)
    sampler.start()
    try:
        for i in range(4):  # 512 MiB through a cache of at most 60 MiB
            assert read_file(daemon.mountpoint / f"parts/part{i}.bin")[0] == digests["quarter"]
        s = wait_written(daemon)
    finally:
        sampler.stop()
    final = du(cache)
    assert sampler.samples > 10
    assert sampler.max_du <= limit + METADATA_SLACK, sampler.max_du
    assert final <= limit + METADATA_SLACK
    assert sampler.min_free >= 4 * MiB - METADATA_SLACK  # the reserve was never touched
    disk = s["disk"]
    assert disk["writer"]["written"] > limit // BLOCK  # it did cache, and more than fits once
    assert disk["space"]["pruned_entries"] > 0
    assert disk["writer"]["failed"] == 0
    assert disk["space"]["used_bytes"] <= limit
    # (each process of a multi-process mount fetches the blocks it serves: up to once each)
    assert 4 * QUARTER <= s["storage"]["range_bytes"] <= PROCESSES * 4 * QUARTER
    assert "is full" not in daemon.log()  # pruning kept up; the disk never looked full
    print(
        f"\ntmpfs 64 MiB, limit {limit // MiB} MiB: peak du {sampler.max_du / MiB:.1f} MiB, "
        f"final {final / MiB:.1f} MiB, {disk['writer']['written']} blocks written, "
        f"{disk['space']['pruned_entries']} pruned in {disk['space']['prune_runs']} passes, "
        f"{disk['writer']['dropped_no_space']} skipped for space"
    )


def test_a_disk_filled_by_someone_else_does_not_fail_reads(dataset, small_disk, mount_factory):
    container, digests = dataset
    cache = small_disk / "cache"
    daemon = mount_with_cache(mount_factory, container, cache, DATASET_RESERVED_FREE_DISK_SPACE="0")
    assert read_file(daemon.mountpoint / "medium.bin")[0] == digests["medium.bin"]
    pruned_before = wait_written(daemon)["disk"]["space"]["pruned_entries"]
    # another process takes every byte that is left
    with open(small_disk / "filler", "wb") as filler:
        try:
            while True:
                filler.write(b"\0" * MiB)
                filler.flush()
        except OSError:
            pass
    for i in range(2):
        assert read_file(daemon.mountpoint / f"parts/part{i}.bin")[0] == digests["quarter"]
    s = wait_written(daemon)
    writer, space = s["disk"]["writer"], s["disk"]["space"]
    # the cache met the full disk: it skipped writes, or it made room by removing its own
    # entries (medium.bin's); which of the two a process does first depends on whether its
    # pass or another process's write came first
    skipped = writer["dropped_no_space"] + writer["failed"]
    assert skipped > 0 or space["pruned_entries"] > pruned_before, s["disk"]
    log = daemon.log()
    # said once per process that found the disk full, not once per write
    assert log.count("is full") <= PROCESSES, log[-5000:]
    if skipped:
        assert log.count("is full") >= 1, log[-5000:]
    assert "ERROR" not in log


# -- crashes ----------------------------------------------------------------------------------


@FETCHES_PER_PROCESS
def test_sigkill_mid_write_then_remount_reads_right(dataset, mount_factory, cache_dir):
    container, digests = dataset
    # one slow-ish writer so the kill lands while blocks are queued and being written
    first = mount_with_cache(
        mount_factory, container, cache_dir, DATASET_MOUNT_BLOCK_FILE_CACHE_WRITE_THREADS="1"
    )
    path = first.mountpoint / "big.bin"

    def reader() -> None:
        try:
            read_file(path)
        except OSError:
            pass  # the daemon is gone: ENOTCONN

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while True:
        writer = stats(first)["disk"]["writer"]
        if writer["written"] >= 5 and writer["queued_blocks"] > 0:
            break
        assert time.monotonic() < deadline, writer
        time.sleep(0.01)
    os.kill(first.pid, signal.SIGKILL)
    first.proc.wait(10)
    thread.join(30)
    first.stop()  # unmounts the dead mount

    layout = CacheLayout(cache_dir)
    before = layout.scan(remove_stale_temporaries=False)
    # what a kill inside write() leaves behind, in case the kill fell between two writes
    some_dir = Path(layout.entries()[0].path).parent
    (some_dir / f"{TEMP_PREFIX}{first.pid}-99-0badf00d").write_bytes(b"half a block")
    left_behind = before.temporaries + 1

    second = mount_with_cache(mount_factory, container, cache_dir, name="again")
    digest, _ = read_file(second.mountpoint / "big.bin")
    assert digest == digests["big.bin"]
    s = wait_written(second)
    assert s["disk"]["space"]["temporaries_removed"] == left_behind
    assert s["disk"]["hits"] >= before.entries  # everything written before the kill
    assert s["storage"]["range_bytes"] == BIG - s["disk"]["hits"] * BLOCK  # BIG: whole blocks
    assert s["disk"]["corrupt"] == 0
    after = layout.scan(remove_stale_temporaries=False)
    assert after.temporaries == 0
    assert after.entries == blocks_of(BIG)


# -- cache info / clear -------------------------------------------------------------------------


def cache_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blobmount", "cache", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cache_info_and_clear_next_to_live_mounts(dataset, azurite, mount_factory, cache_dir):
    container, digests = dataset
    other = f"other-{uuid.uuid4().hex[:8]}"
    azurite.create_container(other)
    try:
        azurite.upload(other, "x.bin", pattern_bytes("x", 0, 3 * BLOCK))
        one = mount_with_cache(mount_factory, container, cache_dir)
        two = mount_with_cache(mount_factory, other, cache_dir)  # one cache, two containers
        assert read_file(one.mountpoint / "medium.bin")[0] == digests["medium.bin"]
        assert read_file(two.mountpoint / "x.bin")[0] == sha(pattern_bytes("x", 0, 3 * BLOCK))
        wait_written(one)
        wait_written(two)

        done = cache_cli("info", str(cache_dir), "--json")
        assert done.returncode == 0, done.stderr
        info = json.loads(done.stdout)
        assert info["in_use"] is True
        assert info["entries"] == blocks_of(MEDIUM) + 3
        by_container = {loc["location"]: loc["entries"] for loc in info["locations"]}
        assert by_container == {
            f"{azurite.account}/{container}": blocks_of(MEDIUM),
            f"{azurite.account}/{other}": 3,
        }

        refused = cache_cli("clear", str(cache_dir))
        assert refused.returncode == 1
        assert "in use" in refused.stderr
        assert CacheLayout(cache_dir).scan().entries == blocks_of(MEDIUM) + 3  # nothing removed

        one.stop()
        two.stop()
        done = cache_cli("clear", str(cache_dir))
        assert done.returncode == 0, done.stderr
        info = json.loads(cache_cli("info", str(cache_dir), "--json").stdout)
        assert (info["entries"], info["in_use"]) == (0, False)
    finally:
        azurite.delete_container(other)
