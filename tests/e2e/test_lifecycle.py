"""Consistency and lifecycle through a real mount.

- versions: an open handle is pinned to the ETag it saw at open; a blob replaced or deleted under
  it fails that handle's reads (EIO / ENOENT), never mixes versions; the attribute TTL decides
  when a new open sees the new version, and without a TTL the view is fixed;
- stopping: SIGTERM/SIGINT let reads in flight finish, then unmount; reads stuck past
  DATASET_UNMOUNT_TIMEOUT_SECONDS do not hold the unmount; a remount over a mount left dead by
  SIGKILL cleans it up and says so;
- odd input from the kernel side: names that are not UTF-8, names over 255 bytes, deep nesting,
  reads past the end, zero-length reads, reads of a folder;
- memory: the daemon's peak RSS while streaming a 2 GiB blob, and with many slow readers.

Huge folders are in test_listing_scale.py, storage faults in test_faults.py.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from azure.storage.blob import BlobServiceClient

from blobmount.blocks.fetcher import COALESCE_BYTES
from blobmount.testing.pattern import pattern_bytes
from tests.helpers.bounds import SLACK_S, MiB, in_thread
from tests.helpers.daemon_calls import blobmount, stats, wait_for
from tests.helpers.fault_proxy import FaultProxy, stall
from tests.helpers.mount import MountedDaemon, is_mounted
from tests.helpers.single_process import PROCESSES

pytestmark = [pytest.mark.fuse, pytest.mark.azurite]

TTL_MS = 1000
#: comfortably past the TTL; only ever waited for, never raced against
PAST_TTL_S = TTL_MS / 1000 + 0.5


def read_or_errno(fd: int, size: int, offset: int) -> bytes | int:
    try:
        return os.pread(fd, size, offset)
    except OSError as exc:
        return exc.errno


# -- versions -----------------------------------------------------------------------------------


def test_overwrite_under_an_open_handle_gives_eio_never_mixed_bytes(
    container, azurite, mount_factory
):
    v1 = pattern_bytes("v1", 0, 16 * MiB)
    v2 = pattern_bytes("v2", 0, 12 * MiB + 7)
    azurite.upload(container, "data/model.bin", v1)
    # no TTL: the kernel keeps v1's size for as long as the test runs (see the next test)
    daemon = mount_factory(container)
    path = daemon.mountpoint / "data/model.bin"
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(fd, MiB, 0) == v1[:MiB]
        azurite.upload(container, "data/model.bin", v2)
        offsets = range(MiB, len(v1), MiB)
        outcomes = [read_or_errno(fd, MiB, offset) for offset in offsets]
    finally:
        os.close(fd)
    for offset, outcome in zip(offsets, outcomes, strict=True):
        if isinstance(outcome, int):
            assert outcome == errno.EIO
        else:
            # bytes of the pinned version, exactly; a short read is allowed (the part of a read
            # before a block that fails), an early end of file is not
            assert outcome
            assert outcome == v1[offset : offset + len(outcome)]
    # blocks the handle already held (its read-ahead) are still v1; the rest of the file is not
    assert errno.EIO in outcomes
    assert stats(daemon)["storage"]["errors"].get("BlobChanged", 0) > 0


def test_a_reopen_after_the_ttl_gives_the_new_version(container, azurite, mount_factory):
    v1 = pattern_bytes("v1", 0, 16 * MiB)
    v2 = pattern_bytes("v2", 0, 12 * MiB + 7)
    azurite.upload(container, "data/model.bin", v1)
    daemon = mount_factory(container, env={"DATASET_MOUNT_ATTRIBUTE_CACHE_TTL": str(TTL_MS)})
    path = daemon.mountpoint / "data/model.bin"
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(fd, MiB, 0) == v1[:MiB]
        azurite.upload(container, "data/model.bin", v2)
        time.sleep(PAST_TTL_S)
        assert path.stat().st_size == len(v2)
        assert path.read_bytes() == v2  # a new open: the new version, in full
        # The old handle still never returns v2's bytes. Its inode now has v2's size, though
        # (one inode per path, one size in the kernel): past that size it reads end of file.
        # docs/RELIABILITY.md, "Known limits".
        for offset in range(MiB, len(v2), MiB):
            outcome = read_or_errno(fd, MiB, offset)
            if isinstance(outcome, int):
                assert outcome == errno.EIO
            else:
                assert outcome != v2[offset : offset + len(outcome)], "v2 bytes on a v1 handle"
                assert outcome == v1[offset : offset + len(outcome)]
    finally:
        os.close(fd)


def test_blob_deleted_under_an_open_handle_gives_enoent(container, azurite, mount_factory):
    azurite.upload(container, "gone.bin", pattern_bytes("gone", 0, 8 * MiB))
    daemon = mount_factory(container)
    fd = os.open(daemon.mountpoint / "gone.bin", os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == pattern_bytes("gone", 0, 4096)
        azurite.delete_blob(container, "gone.bin")
        with pytest.raises(FileNotFoundError):
            os.pread(fd, 4096, 7 * MiB)  # the last block: not read ahead by then
    finally:
        os.close(fd)
    assert daemon.proc is not None
    assert daemon.proc.poll() is None


def test_changes_after_the_mount_are_seen_once_the_ttl_expires(container, azurite, mount_factory):
    azurite.upload_many(container, [("d/a.txt", b"one"), ("d/gone.txt", b"gone")])
    daemon = mount_factory(container, env={"DATASET_MOUNT_ATTRIBUTE_CACHE_TTL": str(TTL_MS)})
    d = daemon.mountpoint / "d"
    assert sorted(os.listdir(d)) == ["a.txt", "gone.txt"]
    assert (d / "a.txt").read_bytes() == b"one"
    assert not (d / "new.txt").exists()  # a negative lookup, cached for the TTL too
    azurite.upload(container, "d/a.txt", b"two, longer")
    azurite.upload(container, "d/new.txt", b"new")
    azurite.delete_blob(container, "d/gone.txt")
    time.sleep(PAST_TTL_S)
    assert sorted(os.listdir(d)) == ["a.txt", "new.txt"]
    assert (d / "a.txt").stat().st_size == len(b"two, longer")
    assert (d / "a.txt").read_bytes() == b"two, longer"  # not the kernel's cached pages
    assert (d / "new.txt").read_bytes() == b"new"
    assert not (d / "gone.txt").exists()


def test_without_a_ttl_the_view_is_fixed_for_the_life_of_the_mount(
    container, azurite, mount_factory
):
    azurite.upload_many(
        container, [("d/read.txt", b"one"), ("d/unread.txt", b"uno"), ("d/gone.txt", b"gone")]
    )
    daemon = mount_factory(container)
    d = daemon.mountpoint / "d"
    assert sorted(os.listdir(d)) == ["gone.txt", "read.txt", "unread.txt"]
    assert (d / "read.txt").read_bytes() == b"one"
    assert not (d / "new.txt").exists()
    azurite.upload(container, "d/read.txt", b"two, longer")
    azurite.upload(container, "d/unread.txt", b"dos, longer")
    azurite.upload(container, "d/new.txt", b"new")
    azurite.delete_blob(container, "d/gone.txt")
    time.sleep(PAST_TTL_S)  # as long as the TTL test waits: time alone changes nothing
    assert sorted(os.listdir(d)) == ["gone.txt", "read.txt", "unread.txt"]
    assert not (d / "new.txt").exists()
    assert (d / "read.txt").stat().st_size == 3
    assert (d / "read.txt").read_bytes() == b"one"  # the version first seen, from cache
    # the version first seen is no longer in storage: never the new bytes, an error instead
    with pytest.raises(OSError) as info:
        (d / "unread.txt").read_bytes()
    assert info.value.errno == errno.EIO
    assert (d / "gone.txt").stat().st_size == 4
    with pytest.raises(OSError) as info:
        (d / "gone.txt").read_bytes()
    assert info.value.errno in (errno.ENOENT, errno.EIO)


# -- stopping -----------------------------------------------------------------------------------

BIG = "data/big.bin"
BIG_SIZE = 16 * MiB


@pytest.fixture(scope="module")
def big(azurite) -> Iterator[str]:
    name = f"life-{uuid.uuid4().hex[:8]}"
    azurite.create_container(name)
    azurite.upload(name, BIG, pattern_bytes(BIG, 0, BIG_SIZE))
    try:
        yield name
    finally:
        azurite.delete_container(name)


@pytest.fixture
def proxied_mount(proxy, mount_factory, big) -> Iterator[Callable[..., MountedDaemon]]:
    def mount(env: dict[str, str]) -> MountedDaemon:
        return mount_factory(big, env=env, base_url=proxy.account_url)

    yield mount
    proxy.clear()  # before mount_factory's teardown: no read may stay held by a stall


def release_and_close(proxy: FaultProxy, daemon: MountedDaemon, fds: list[int]) -> None:
    """Let held reads go, then close the files. A close waits for the daemon to answer; if a
    broken daemon never does, stop it (it is this test's) rather than hang the test run."""
    proxy.clear()

    def close_all() -> None:
        for fd in fds:
            with contextlib.suppress(OSError):  # the mount may be gone: the fd is freed anyway
                os.close(fd)

    closing = in_thread(close_all)
    try:
        closing.result(timeout=SLACK_S)
    except TimeoutError:
        assert daemon.proc is not None
        daemon.proc.kill()
        closing.result(timeout=SLACK_S)
        raise


def start_stalled_reads(
    daemon: MountedDaemon, proxy: FaultProxy, blocks: list[int]
) -> tuple[list[int], list]:
    """Open BIG once per block and start a read of each, all held by the proxy until released.
    Returns the fds and the read futures."""
    path = daemon.mountpoint / BIG
    fds = [os.open(path, os.O_RDONLY) for _ in blocks]
    proxy.set_fault(stall(None))
    reads = [
        in_thread(os.pread, fd, 64 * 1024, index * 2 * MiB + 4096)
        for fd, index in zip(fds, blocks, strict=True)
    ]
    assert proxy.wait_until(lambda p: p.stalled >= len(blocks), 30), proxy.counts()
    return fds, reads


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_lets_reads_in_flight_finish_then_unmounts(proxied_mount, proxy, signum):
    daemon = proxied_mount(
        {
            "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT": "0",  # one GET per read, nothing else
            "DATASET_MOUNT_READ_TIMEOUT_SECONDS": "60",
            "DATASET_UNMOUNT_TIMEOUT_SECONDS": "60",
        }
    )
    blocks = [1, 3, 5, 7]
    fds, reads = start_stalled_reads(daemon, proxy, blocks)
    try:
        os.kill(daemon.pid, signum)
        name = signal.Signals(signum).name
        # each process of the mount logs the requests it holds (one process: all four)
        pattern = re.compile(rf"{name}: finishing (\d+) requests in flight")

        def finishing() -> int:
            return sum(int(count) for count in pattern.findall(daemon.log()))

        assert wait_for(lambda: finishing() == 4, 30), daemon.log()
        # the reads are held, so a daemon that stopped now would have dropped them
        assert daemon.proc is not None
        assert daemon.proc.poll() is None
        assert is_mounted(daemon.mountpoint)
        assert not any(read.done() for read in reads)
        proxy.clear()
        for index, read in zip(blocks, reads, strict=True):
            offset = index * 2 * MiB + 4096
            assert read.result(timeout=60) == pattern_bytes(BIG, offset, 64 * 1024)
    finally:
        release_and_close(proxy, daemon, fds)
    assert daemon.proc.wait(timeout=60 + SLACK_S) == 0
    assert not is_mounted(daemon.mountpoint)
    assert "unmounted" in daemon.log()


def test_reads_stuck_past_the_unmount_timeout_do_not_hold_the_unmount(proxied_mount, proxy):
    unmount_timeout_s = 2
    daemon = proxied_mount(
        {
            "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT": "0",
            # the read would wait this long for its first byte: far past the unmount timeout
            "DATASET_MOUNT_READ_TIMEOUT_SECONDS": "300",
            "DATASET_UNMOUNT_TIMEOUT_SECONDS": str(unmount_timeout_s),
        }
    )
    fds, reads = start_stalled_reads(daemon, proxy, [2])
    try:
        os.kill(daemon.pid, signal.SIGTERM)
        assert daemon.proc is not None
        # the disk tier may take another unmount timeout to write what is queued
        assert daemon.proc.wait(timeout=2 * unmount_timeout_s + SLACK_S) == 0
        assert not is_mounted(daemon.mountpoint)
        with pytest.raises(OSError):  # the connection to the daemon is gone
            reads[0].result(timeout=SLACK_S)
        assert "still in flight after 2s; unmounting anyway" in daemon.log()
    finally:
        release_and_close(proxy, daemon, fds)


@pytest.fixture
def cli_mounts(fuse_ok, tmp_path) -> Iterator[tuple[Path, list[int]]]:
    """A mount point and a list to put daemon PIDs in; everything is cleaned up after."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    pids: list[int] = []
    yield mnt, pids
    for pid in pids:
        if psutil.pid_exists(pid):
            os.kill(pid, signal.SIGKILL)
    for _ in range(4):  # a dead mount may be stacked under a live one
        if not is_mounted(mnt):
            break
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, check=False)


def daemon_pid(done: subprocess.CompletedProcess[str]) -> int:
    return int(done.stdout.split("(pid ")[1].split(",")[0])


def test_mount_over_a_mount_left_dead_by_sigkill_cleans_it_up(
    azurite, big, mount_env, tmp_path, cli_mounts
):
    mnt, pids = cli_mounts
    uri = f"{azurite.account_url}/{big}"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    done = blobmount("mount", uri, str(mnt), "--log-file", str(first_log), env=mount_env)
    assert done.returncode == 0, done.stderr
    pids.append(daemon_pid(done))
    assert (mnt / BIG).stat().st_size == BIG_SIZE

    os.kill(pids[0], signal.SIGKILL)
    psutil.Process(pids[0]).wait(30)
    # "Transport endpoint is not connected" (a plain stat of the root can still be answered from
    # the kernel's attribute cache, which is what once hid the dead mount from `mount`)
    assert errno_of(lambda: os.listdir(mnt)) == errno.ENOTCONN
    assert errno_of(lambda: os.stat(mnt)) is None

    done = blobmount("mount", uri, str(mnt), "--log-file", str(second_log), env=mount_env)
    assert done.returncode == 0, done.stderr
    pids.append(daemon_pid(done))
    assert "left by a dead FUSE daemon" in second_log.read_text()
    with open(mnt / BIG, "rb") as f:
        f.seek(5 * MiB)
        assert f.read(MiB) == pattern_bytes(BIG, 5 * MiB, MiB)

    done = blobmount("unmount", str(mnt), env=mount_env)
    assert done.returncode == 0, done.stderr
    assert not is_mounted(mnt)


# -- odd input from the kernel side -------------------------------------------------------------

LONGEST = "n" * 255
LONGEST_UTF8 = "é" * 127 + "x"  # 255 bytes
TOO_LONG_UTF8 = "é" * 128  # 256 bytes: a blob whose name cannot be a file name here
DEEP = "deep/" + "d/" * 200 + "leaf.txt"


@pytest.fixture(scope="module")
def odd(azurite) -> Iterator[str]:
    name = f"odd-{uuid.uuid4().hex[:8]}"
    azurite.create_container(name)
    azurite.upload_many(
        name,
        [
            ("odd/file.txt", pattern_bytes("file", 0, 10_000)),
            (f"odd/{LONGEST}", b"longest ascii"),
            (f"odd/{LONGEST_UTF8}", b"longest utf-8"),
            (f"odd/{TOO_LONG_UTF8}", b"never shown"),
            ("odd/sub/child.txt", b"child"),
            ("odd/empty.bin", b""),
            (DEEP, b"at the bottom"),
        ],
    )
    try:
        yield name
    finally:
        azurite.delete_container(name)


@pytest.fixture
def odd_mount(odd, mount_factory) -> Iterator[MountedDaemon]:
    daemon = mount_factory(odd)
    yield daemon
    # whatever the test did, the daemon is still up and never hit an unexpected error
    assert daemon.proc is not None
    assert daemon.proc.poll() is None
    log = daemon.log()
    assert "Traceback" not in log
    assert " ERROR " not in log


def errno_of(fn: Callable[[], object]) -> int | None:
    try:
        fn()
    except OSError as exc:
        return exc.errno
    return None


def test_names_that_are_not_utf8_are_simply_absent(odd_mount):
    odd = bytes(odd_mount.mountpoint) + b"/odd/"
    for raw in (b"\xff", b"caf\xe9.txt", b"\xed\xa0\x80", b"file.txt\xff"):
        assert errno_of(lambda raw=raw: os.stat(odd + raw)) == errno.ENOENT
        assert errno_of(lambda raw=raw: os.open(odd + raw, os.O_RDONLY)) == errno.ENOENT
        assert errno_of(lambda raw=raw: os.listdir(odd + raw)) == errno.ENOENT
    assert b"file.txt" in os.listdir(odd)


def test_long_names(odd_mount):
    odd = odd_mount.mountpoint / "odd"
    assert (odd / LONGEST).read_bytes() == b"longest ascii"
    assert (odd / LONGEST_UTF8).read_bytes() == b"longest utf-8"
    names = os.listdir(odd)
    assert LONGEST in names
    assert LONGEST_UTF8 in names
    assert TOO_LONG_UTF8 not in names  # left out of the listing (and logged once)
    assert errno_of(lambda: os.stat(odd / ("m" * 255))) == errno.ENOENT
    for name in (TOO_LONG_UTF8, "x" * 256, "x" * 1000, "x" * 5000):
        assert errno_of(lambda name=name: os.stat(odd / name)) == errno.ENAMETOOLONG
    assert os.statvfs(odd).f_namemax == 255


def test_deep_nesting(odd_mount):
    mnt = odd_mount.mountpoint
    leaf = mnt / DEEP
    assert leaf.read_bytes() == b"at the bottom"
    found = [os.path.join(root, f) for root, _, files in os.walk(mnt / "deep") for f in files]
    assert found == [str(leaf)]
    depth = sum(1 for _ in os.walk(mnt / "deep"))
    assert depth == 201  # deep/ and its 200 nested d/ folders


def test_reads_past_the_end_and_zero_length_reads(odd_mount):
    path = odd_mount.mountpoint / "odd/file.txt"
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(fd, 0, 0) == b""
        assert os.read(fd, 0) == b""
        assert os.pread(fd, 100, 9_990) == pattern_bytes("file", 9_990, 10)
        assert os.pread(fd, 100, 10_000) == b""
        assert os.pread(fd, 100, 10**12) == b""
        assert os.pread(fd, 1 << 20, 0) == pattern_bytes("file", 0, 10_000)
    finally:
        os.close(fd)
    empty = odd_mount.mountpoint / "odd/empty.bin"
    assert empty.stat().st_size == 0
    assert empty.read_bytes() == b""


def test_folders_are_not_files(odd_mount):
    odd = odd_mount.mountpoint / "odd"
    fd = os.open(odd, os.O_RDONLY)
    try:
        assert errno_of(lambda: os.read(fd, 100)) == errno.EISDIR
    finally:
        os.close(fd)
    assert errno_of(lambda: os.open(odd, os.O_WRONLY)) in (errno.EISDIR, errno.EROFS)
    assert errno_of(lambda: os.open(str(odd / "file.txt") + "/", os.O_RDONLY)) == errno.ENOTDIR
    assert errno_of(lambda: os.stat(odd / "file.txt" / "child")) == errno.ENOTDIR
    assert errno_of(lambda: os.listdir(odd / "file.txt")) == errno.ENOTDIR


# -- memory -------------------------------------------------------------------------------------

STREAM = "stream/2g.bin"
STREAM_SIZE = 2 * 1024 * MiB
SLOW_FILES = 32
SLOW_SIZE = 40 * MiB


def stamped(seed: int, size: int) -> bytes:
    """Random 1 MiB repeated, each MiB starting with (seed, its index): cheap to make at 2 GiB,
    and a block served at the wrong offset, of the wrong file or cut short shows."""
    unit = random.Random(seed).randbytes(MiB)[16:]
    count = size // MiB
    return b"".join(
        seed.to_bytes(8, "little") + i.to_bytes(8, "little") + unit for i in range(count)
    )


def stamped_mib(seed: int, index: int) -> bytes:
    return (
        seed.to_bytes(8, "little")
        + index.to_bytes(8, "little")
        + (random.Random(seed).randbytes(MiB)[16:])
    )


@pytest.fixture(scope="module")
def big_blobs(azurite) -> Iterator[str]:
    """A 2 GiB blob and SLOW_FILES blobs of 40 MiB, each one Put Blob (see DESIGN.md)."""
    name = f"mem-{uuid.uuid4().hex[:8]}"
    azurite.create_container(name)
    service = BlobServiceClient.from_connection_string(
        azurite.connection_string,
        max_single_put_size=STREAM_SIZE + MiB,
        max_block_size=STREAM_SIZE + MiB,
    )
    try:
        with service:
            container = service.get_container_client(name)
            container.upload_blob(STREAM, stamped(0, STREAM_SIZE), overwrite=True)
        azurite.upload_many(
            name, [(f"slow/{i:02d}.bin", stamped(i + 1, SLOW_SIZE)) for i in range(SLOW_FILES)]
        )
        yield name
    finally:
        azurite.delete_container(name)


class PeakRss:
    """Samples a process's RSS on a thread; `peak` also reads the kernel's high-water mark."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.samples.append(self.process.memory_info().rss)

    def __enter__(self) -> PeakRss:
        # start the high-water mark from now (root may reset it; otherwise it counts from start)
        try:
            Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")
        except OSError:
            pass
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def rss(self) -> int:
        return self.process.memory_info().rss

    def peak(self) -> int:
        hwm = 0
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
        return max([hwm, *self.samples])


def settings_budget(daemon: MountedDaemon) -> dict[str, int]:
    s = stats(daemon)
    blocks = s["blocks"]
    disk = s.get("disk") or {}
    queue = (disk.get("writer") or {}).get("max_queue_bytes", 0)
    return {
        "ram_tier": blocks["ram"]["capacity_bytes"],
        "read_ahead": blocks["read_ahead_budget_bytes"],
        "disk_queue": queue,
    }


#: what the bound allows beyond the settings: a GET answer (up to COALESCE_BYTES for a read-ahead
#: request of several blocks) arrives as socket chunks joined into blocks, so while a block is
#: joined its chunks and the blocks so far coexist; each of DATASET_MOUNT_READ_THREADS requests
#: is allowed twice its size (a whole body and its block copies, before blocks were cut as the
#: chunks arrive: kept as the safe side)
def in_flight_bytes(read_threads: int, block_size: int = 2 * MiB) -> int:
    return read_threads * 2 * max(block_size, COALESCE_BYTES)


#: allocator slack and the Python heap's own growth while busy; measured, see RELIABILITY.md
OVERHEAD_BYTES = 64 * MiB


def read_threads(daemon: MountedDaemon) -> int:
    """DATASET_MOUNT_READ_THREADS as the daemon logged it at start."""
    line = next(x for x in daemon.log().splitlines() if "DATASET_MOUNT_READ_THREADS=" in x)
    return int(line.split("DATASET_MOUNT_READ_THREADS=")[1].split(";")[0])


SMALL = {
    "DATASET_MOUNT_MEMORY_CACHE_SIZE": "32MB",
    "DATASET_MOUNT_READ_AHEAD_MEMORY_LIMIT": "32MB",
    "DATASET_MOUNT_BLOCK_FILE_CACHE_MAX_QUEUE_SIZE": "32MB",
}


@pytest.mark.parametrize("env", [{}, SMALL], ids=["defaults", "small-settings"])
def test_streaming_2_gib_stays_within_the_memory_settings(big_blobs, mount_factory, env):
    daemon = mount_factory(big_blobs, env=env)
    path = daemon.mountpoint / STREAM
    threads = read_threads(daemon)
    budget = settings_budget(daemon)
    with PeakRss(daemon.pid) as rss:
        baseline = rss.rss()
        with open(path, "rb", buffering=0) as f:
            for index in range(STREAM_SIZE // MiB):
                chunk = f.read(MiB)
                assert chunk[:16] == stamped_mib(0, index)[:16], f"MiB {index}"
                if index % 256 == 0:
                    assert chunk == stamped_mib(0, index)
            assert f.read(1) == b""
    peak = rss.peak()
    allowed = sum(budget.values()) + in_flight_bytes(threads) + OVERHEAD_BYTES
    writer = (stats(daemon).get("disk") or {}).get("writer") or {}
    print(
        f"streaming 2 GiB ({threads} read threads): baseline {baseline / MiB:.0f} MiB, "
        f"peak {peak / MiB:.0f} MiB (+{(peak - baseline) / MiB:.0f} MiB); settings "
        f"{ {k: v // MiB for k, v in budget.items()} } MiB, disk queue peak "
        f"{writer.get('peak_queued_bytes', 0) // MiB} MiB; allowed +{allowed / MiB:.0f} MiB"
    )
    assert peak - baseline <= allowed


def test_many_slow_readers_cannot_grow_memory_without_bound(big_blobs, mount_factory):
    # a fixed read-ahead limit: the automatic one depends on the machine's memory
    env = {
        "DATASET_MOUNT_BLOCK_FILE_CACHE_MAX_QUEUE_SIZE": "32MB",
        "DATASET_MOUNT_READ_AHEAD_MEMORY_LIMIT": "128MB",
    }
    daemon = mount_factory(big_blobs, env=env)
    threads = read_threads(daemon)
    budget = settings_budget(daemon)
    paths = [daemon.mountpoint / f"slow/{i:02d}.bin" for i in range(SLOW_FILES)]
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    try:
        with PeakRss(daemon.pid) as rss:
            baseline = rss.rss()
            after_round = []
            for step in range(12):
                # each reader moves on 2 MiB, in kernel-sized reads, then pauses
                for i, fd in enumerate(fds):
                    offset = step * 2 * MiB
                    data = b"".join(
                        os.pread(fd, 128 * 1024, offset + k) for k in range(0, 2 * MiB, 128 * 1024)
                    )
                    assert data[:16] == stamped_mib(i + 1, offset // MiB)[:16]
                time.sleep(0.2)
                after_round.append(rss.rss())
            held = stats(daemon)["blocks"]["read_ahead_bytes"]
    finally:
        for fd in fds:
            os.close(fd)
    peak = rss.peak()
    # every reader may hold the block it is in and the next, beyond the read-ahead budget; in
    # each process its reads land in (the budget is divided, blocks are not shared)
    readers_bytes = SLOW_FILES * 2 * 2 * MiB * PROCESSES
    allowed = sum(budget.values()) + readers_bytes + in_flight_bytes(threads) + OVERHEAD_BYTES
    print(
        f"{SLOW_FILES} slow readers: baseline {baseline / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB "
        f"(+{(peak - baseline) / MiB:.0f} MiB), after each round "
        f"{[round((r - baseline) / MiB) for r in after_round]} MiB; read-ahead held "
        f"{held / MiB:.0f} MiB of {budget['read_ahead'] / MiB:.0f}; "
        f"allowed +{allowed / MiB:.0f} MiB"
    )
    assert held <= budget["read_ahead"] + readers_bytes
    assert peak - baseline <= allowed
