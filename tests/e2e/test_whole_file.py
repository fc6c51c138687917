"""Whole-file mode (DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=false) through a real mount of
Azurite: random reads of a 300 MB file served from the local copy, sqlite on a database blob, two
processes opening one file at once (one download), a file larger than the cache streamed in
block mode, a remount that reuses the copy, and a failing download that fails the open cleanly.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import sqlite3
import subprocess
import sys
import time
import uuid

import pytest

from blobmount.cachedir.layout import TEMP_PREFIX, CacheLayout
from blobmount.testing.pattern import pattern_bytes
from tests.helpers.fault_proxy import server_error
from tests.helpers.mount import daemon_stats as stats
from tests.helpers.single_process import FETCHES_PER_PROCESS, PAGE_CACHE_AT_OPEN
from tests.helpers.sqlite_db import sqlite_bytes

pytestmark = [pytest.mark.fuse, pytest.mark.azurite]

MiB = 1024 * 1024
BIG = 300 * 1000 * 1000  # the "300 MB file"
PART = 8 * MiB  # whole-file downloads use 8 MiB ranged GETs
WHOLE = {"DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "false"}
#: small files, held in memory while open (up to 256 KiB)
SMALL = {f"small/{i}.bin": pattern_bytes(f"small-{i}", 0, 5_000 + 9_000 * i) for i in range(12)}


@pytest.fixture(scope="module")
def dataset(azurite, tmp_path_factory):
    """big.bin (300 MB), medium.bin (40 MiB), db/data.sqlite."""
    container = f"whole-{uuid.uuid4().hex[:8]}"
    azurite.create_container(container)
    big = pattern_bytes("whole-big", 0, BIG)
    db = sqlite_bytes(tmp_path_factory.mktemp("db"), 50_000, lambda i: f"row-{i}" * 30, index=True)
    azurite.upload_many(
        container,
        [
            ("big.bin", big),
            ("medium.bin", pattern_bytes("whole-medium", 0, 40 * MiB)),
            ("db/data.sqlite", db),
            *SMALL.items(),
        ],
        threads=3,
    )
    del big
    try:
        yield container
    finally:
        azurite.delete_container(container)


def cache_files(cache_dir) -> tuple[list[str], list[str]]:
    """(entry names, temporary names) under the cache directory."""
    entries = [os.path.basename(e.path) for e in CacheLayout(cache_dir).entries()]
    temps = [n for _, _, names in os.walk(cache_dir) for n in names if n.startswith(TEMP_PREFIX)]
    return entries, temps


@PAGE_CACHE_AT_OPEN
def test_small_files_are_read_from_the_page_cache_their_open_filled(dataset, mount_factory):
    # each small file's bytes go into the kernel's page cache with its open: its reads, in
    # pieces and at offsets, are answered by the kernel, with no READ to the daemon (which
    # would count its bytes as served a second time)
    daemon = mount_factory(dataset, env=WHOLE)
    for name, data in SMALL.items():
        fd = os.open(daemon.mountpoint / name, os.O_RDONLY)
        try:
            pieces = []
            while piece := os.read(fd, 4096):
                pieces.append(piece)
            assert b"".join(pieces) == data, name
            assert os.pread(fd, 100, len(data) // 2) == data[len(data) // 2 :][:100]
        finally:
            os.close(fd)
    whole = stats(daemon)["whole_file"]
    assert whole["preloaded_opens"] == whole["downloads"] == len(SMALL)
    assert whole["served_bytes"] == sum(len(d) for d in SMALL.values())
    # a second read of each (its handle closed, the pages kept) is the kernel's too
    for name, data in SMALL.items():
        assert (daemon.mountpoint / name).read_bytes() == data
    again = stats(daemon)["whole_file"]
    assert again["served_bytes"] == whole["served_bytes"]
    assert again["preloaded_opens"] == len(SMALL)


@FETCHES_PER_PROCESS
def test_random_reads_of_a_large_file_come_from_the_local_copy(dataset, mount_factory):
    daemon = mount_factory(dataset, env=WHOLE)
    path = daemon.mountpoint / "big.bin"
    rng = random.Random(7)
    with open(path, "rb", buffering=0) as f:
        after_open = stats(daemon)
        whole = after_open["whole_file"]
        assert (whole["downloads"], whole["downloaded_bytes"]) == (1, BIG)
        gets = after_open["storage"]["range_requests"]
        assert gets == -(-BIG // PART)
        for _ in range(1000):
            offset = rng.randrange(BIG)
            length = rng.randrange(1, 256 * 1024)
            got = os.pread(f.fileno(), length, offset)
            assert got == pattern_bytes("whole-big", offset, min(length, BIG - offset))
    # every read came from the local copy: no storage request after the open
    assert stats(daemon)["storage"]["range_requests"] == gets
    assert len(cache_files(daemon.env["DATASET_MOUNT_CACHE_DIR"])[0]) == 1


@FETCHES_PER_PROCESS
def test_sqlite_queries_on_a_database_blob(dataset, mount_factory):
    daemon = mount_factory(dataset, env=WHOLE)
    db = daemon.mountpoint / "db" / "data.sqlite"
    con = sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)
    try:
        assert con.execute("select count(*), sum(id) from t").fetchone() == (50_000, 1249975000)
        assert con.execute("select v from t where id = 31337").fetchone()[0] == "row-31337" * 30
        # an index lookup: random pages of the file
        assert con.execute("select id from t where v = ?", ("row-777" * 30,)).fetchone() == (777,)
    finally:
        con.close()
    whole = stats(daemon)["whole_file"]
    assert whole["downloads"] == 1
    assert whole["fallbacks"] == whole["failed_downloads"] == 0


_OPEN_AND_HASH = """
import hashlib, sys
with open(sys.argv[1], "rb") as f:
    print(hashlib.sha256(f.read()).hexdigest())
"""


@FETCHES_PER_PROCESS
def test_two_processes_opening_one_file_share_one_download(dataset, mount_factory):
    daemon = mount_factory(dataset, env=WHOLE)
    path = str(daemon.mountpoint / "medium.bin")
    procs = [
        subprocess.Popen([sys.executable, "-c", _OPEN_AND_HASH, path], stdout=subprocess.PIPE)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0].decode().strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    expected = hashlib.sha256(pattern_bytes("whole-medium", 0, 40 * MiB)).hexdigest()
    assert outputs == [expected, expected]
    s = stats(daemon)
    assert s["whole_file"]["downloads"] == 1
    assert s["storage"]["range_requests"] == 40 * MiB // PART


@FETCHES_PER_PROCESS
def test_a_file_larger_than_the_cache_streams_in_block_mode(dataset, mount_factory):
    env = {**WHOLE, "DATASET_MOUNT_CACHE_SIZE": "64MB"}
    daemon = mount_factory(dataset, env=env)
    with open(daemon.mountpoint / "big.bin", "rb") as f:
        digest = hashlib.sha256()
        while chunk := f.read(4 * MiB):
            digest.update(chunk)
    assert digest.hexdigest() == hashlib.sha256(pattern_bytes("whole-big", 0, BIG)).hexdigest()
    # a file that fits is still cached whole
    assert (daemon.mountpoint / "medium.bin").read_bytes()[:10] == pattern_bytes(
        "whole-medium", 0, 10
    )
    whole = stats(daemon)["whole_file"]
    assert (whole["fallbacks"], whole["downloads"]) == (1, 1)
    assert whole["space"]["used_bytes"] <= 64 * 1000 * 1000
    assert "does not fit" in daemon.log()


@FETCHES_PER_PROCESS
def test_a_remount_opens_the_cached_copy_without_downloading(dataset, mount_factory, tmp_path):
    env = {**WHOLE, "DATASET_MOUNT_CACHE_DIR": str(tmp_path / "shared-cache")}
    first = mount_factory(dataset, env=env)
    (first.mountpoint / "medium.bin").read_bytes()
    first.stop()
    second = mount_factory(dataset, env=env)
    data = (second.mountpoint / "medium.bin").read_bytes()
    assert data == pattern_bytes("whole-medium", 0, 40 * MiB)
    s = stats(second)
    assert s["storage"]["range_requests"] == 0
    assert (s["whole_file"]["downloads"], s["whole_file"]["cached_opens"]) == (0, 1)


def test_a_small_file_read_alone_is_written_and_a_remount_reads_it_from_disk(
    dataset, mount_factory, tmp_path
):
    # a small copy's entry is written behind the next fetch; with no fetch after it (the job
    # read one file and paused), it is written anyway, without an unmount to flush it
    env = {**WHOLE, "DATASET_MOUNT_CACHE_DIR": str(tmp_path / "shared-cache")}
    first = mount_factory(dataset, env=env)
    name, data = next(iter(SMALL.items()))
    assert (first.mountpoint / name).read_bytes() == data
    deadline = time.monotonic() + 10
    while not cache_files(env["DATASET_MOUNT_CACHE_DIR"])[0]:
        assert time.monotonic() < deadline, "the entry was not written"
        time.sleep(0.02)
    assert stats(first)["whole_file"]["downloads"] == 1
    first.stop()
    second = mount_factory(dataset, env=env)
    assert (second.mountpoint / name).read_bytes() == data
    s = stats(second)
    assert s["storage"]["range_requests"] == 0
    assert (s["whole_file"]["downloads"], s["whole_file"]["cached_opens"]) == (0, 1)


def test_a_failing_download_fails_the_open_and_leaves_the_cache_clean(
    dataset, mount_factory, proxy
):
    env = {**WHOLE, "AZUREML_DATASET_HTTP_RETRY_COUNT": "2"}
    daemon = mount_factory(dataset, env=env, base_url=proxy.account_url)
    # every GET of the medium file fails: the storage client gives up after its retries
    proxy.set_fault(server_error(500, blob="medium.bin"))
    with pytest.raises(OSError) as info:
        open(daemon.mountpoint / "medium.bin", "rb").close()
    assert info.value.errno == errno.EIO
    cache = daemon.env["DATASET_MOUNT_CACHE_DIR"]
    assert cache_files(cache) == ([], [])
    whole = stats(daemon)["whole_file"]
    assert whole["failed_downloads"] == 1
    assert whole["space"]["reserved_bytes"] == 0
    # the fault gone, the same open works
    proxy.clear()
    data = (daemon.mountpoint / "medium.bin").read_bytes()
    assert (
        hashlib.sha256(data).digest()
        == hashlib.sha256(pattern_bytes("whole-medium", 0, 40 * MiB)).digest()
    )
    assert len(cache_files(cache)[0]) == 1
