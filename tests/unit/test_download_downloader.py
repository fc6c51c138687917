"""Downloader against the in-memory store: bytes, reruns, resume, hostile names, failures.

Storage wrappers used here: CountingStorageClient (request counts), FaultyStorageClient (queued
failures), and `Hooked` below, which runs a test's callback before each ranged GET (to delete
or replace a blob mid-run, queue a fault at an exact part, or hold a GET open).
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

import pytest
import trio
import trio.testing

from blobmount.download_mode.downloader import DownloadConfig, Downloader, DownloadResult
from blobmount.download_mode.manifest import MANIFEST_NAME, Manifest
from blobmount.download_mode.staging import TMP_DIR_NAME, Destination, DestinationError
from blobmount.errors import StorageUnavailable
from blobmount.storage.base import StorageClient
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.faulty import FaultyStorageClient
from blobmount.storage.memory import InMemoryStorageClient
from blobmount.storage.retry import RetryingStorageClient
from blobmount.testing.pattern import pattern_bytes
from tests.helpers.hooked_storage import Hooked

PART = 64 * 1024
BIG = 20 * PART + 123  # 21 parts

TREE: dict[str, bytes] = {
    "data/a.txt": b"alpha\n",
    "data/empty.bin": b"",
    "data/x/y/z/deep.txt": b"deep\n",
    "data/x/y/empty-too": b"",
    "data/x/exactly-one-part.bin": pattern_bytes("one", 0, PART),
    "data/x/one-byte-over.bin": pattern_bytes("over", 0, PART + 1),
    "data/big.bin": pattern_bytes("big", 0, BIG),
    "data/ünï cødé/文件.txt": "unicode ✓\n".encode(),
}
MARKERS = ("data/marked-empty", "data/x/also-marked")
EXPECTED_FILES = {name.removeprefix("data/"): data for name, data in TREE.items()}
EXPECTED_DIRS = {"marked-empty", "x", "x/y", "x/y/z", "x/also-marked", "ünï cødé", "slash-dir"}


def parts(size: int) -> int:
    return math.ceil(size / PART)


EXPECTED_GETS = sum(parts(len(d)) for d in TREE.values())


def make_store() -> InMemoryStorageClient:
    mem = InMemoryStorageClient()
    for name, data in TREE.items():
        mem.put(name, data)
    for name in MARKERS:
        mem.put(name, b"", dir_marker=True)
    mem.put("data/slash-dir/", b"")  # a zero-length "folder/" blob, as some tools make
    mem.put("other/not-in-prefix.txt", b"no")
    return mem


def config(dest: Path, **kw) -> DownloadConfig:
    base = {"dest": dest, "prefix": "data/", "transfers": 4, "part_size": PART}
    base.update(kw)
    return DownloadConfig(**base)


async def download(storage: StorageClient, dest: Path, **kw) -> DownloadResult:
    return await Downloader(storage, config(dest, **kw)).run()


def local_tree(dest: Path) -> tuple[dict[str, bytes], set[str]]:
    files: dict[str, bytes] = {}
    dirs: set[str] = set()
    for root, dirnames, filenames in os.walk(dest):
        rel_root = os.path.relpath(root, dest)
        for d in dirnames:
            dirs.add(os.path.normpath(os.path.join(rel_root, d)))
        for f in filenames:
            rel = os.path.normpath(os.path.join(rel_root, f))
            if rel != MANIFEST_NAME:
                files[rel] = (Path(root) / f).read_bytes()
    return files, dirs


# -- the happy path and reruns -------------------------------------------------------------


async def test_tree_downloads_byte_exact(tmp_path):
    mem = make_store()
    storage = CountingStorageClient(mem)
    dest = tmp_path / "dest"
    result = await download(storage, dest)

    assert result.ok, result
    files, dirs = local_tree(dest)
    assert files == EXPECTED_FILES
    assert dirs == EXPECTED_DIRS
    s = result.stats
    assert (s.files_fetched, s.files_skipped, s.folders, s.failed) == (len(TREE), 0, 3, 0)
    assert s.bytes_fetched == s.bytes_received == s.bytes_queued == sum(map(len, TREE.values()))
    # one GET per part, none for empty blobs; a blob of exactly one part is one GET
    assert storage.statistics().range_requests == EXPECTED_GETS
    assert storage.statistics().list_requests == 1
    assert not (dest / TMP_DIR_NAME).exists()
    # the local mtime is the blob's last-modified time
    props = await mem.get_properties("data/big.bin")
    assert (dest / "big.bin").stat().st_mtime_ns == int(props.last_modified * 1e9)


async def test_a_rerun_transfers_nothing(tmp_path):
    mem = make_store()
    dest = tmp_path / "dest"
    assert (await download(mem, dest)).ok
    again = CountingStorageClient(mem)
    result = await download(again, dest)
    assert result.ok
    assert again.statistics().range_requests == 0
    assert again.statistics().properties_requests == 0
    assert result.stats.files_skipped == len(TREE)
    assert result.stats.files_fetched == 0
    assert local_tree(dest)[0] == EXPECTED_FILES


async def test_a_rerun_fetches_what_changed_went_missing_or_was_edited(tmp_path):
    mem = make_store()
    dest = tmp_path / "dest"
    assert (await download(mem, dest)).ok
    mem.put("data/a.txt", b"alpha, version two\n")  # changed remotely
    (dest / "x/y/z/deep.txt").unlink()  # deleted locally
    (dest / "big.bin").write_bytes(b"X" * BIG)  # edited locally (same size, new mtime)
    mem.put("data/new.txt", b"new\n")  # added remotely

    again = CountingStorageClient(mem)
    result = await download(again, dest)
    assert result.ok
    assert result.stats.files_fetched == 4
    assert again.statistics().range_requests == 1 + 1 + parts(BIG) + 1
    files, _ = local_tree(dest)
    assert files == {**EXPECTED_FILES, "a.txt": b"alpha, version two\n", "new.txt": b"new\n"}


async def test_a_different_source_into_the_same_folder_is_not_trusted(tmp_path):
    dest = tmp_path / "dest"
    first = InMemoryStorageClient("acct/one")
    first.put("f.txt", b"same size")
    assert (await download(first, dest, prefix="")).ok
    second = CountingStorageClient(InMemoryStorageClient("acct/two"))
    second.inner.put("f.txt", b"SAME SIZE")  # type: ignore[attr-defined]
    assert (await download(second, dest, prefix="")).ok
    assert second.statistics().range_requests == 1
    assert (dest / "f.txt").read_bytes() == b"SAME SIZE"


async def test_include_and_exclude_filters(tmp_path):
    mem = make_store()
    dest = tmp_path / "dest"
    result = await download(mem, dest, includes=("x/*", "*.txt"), excludes=("*deep*",))
    assert result.ok
    files, _ = local_tree(dest)
    assert set(files) == {
        "a.txt",
        "ünï cødé/文件.txt",
        "x/y/empty-too",
        "x/exactly-one-part.bin",
        "x/one-byte-over.bin",
    }
    assert result.stats.filtered > 0


async def test_an_empty_prefix_is_fine(tmp_path):
    result = await download(InMemoryStorageClient(), tmp_path / "dest")
    assert result.ok
    assert result.stats.files_fetched == 0
    assert (tmp_path / "dest").is_dir()


# -- names that cannot be paths ------------------------------------------------------------


async def test_hostile_names_are_refused_and_nothing_escapes(tmp_path):
    mem = InMemoryStorageClient()
    hostile = [
        "../escape",
        "a/../../escape2",
        "a//b",
        "/abs",
        "./dot",
        "nul\0byte",
        "long/" + "x" * 256,
        ".blobmount-download.db",
        "trailing/",  # not empty: a file whose name ends in '/'
    ]
    for name in hostile:
        mem.put(name, b"evil" if name != "trailing/" else b"not empty")
    mem.put("good.txt", b"good")
    outside = tmp_path / "outside"
    dest = outside / "dest"
    result = await download(mem, dest, prefix="")

    assert not result.ok
    assert {f.blob for f in result.failures} == set(hostile)
    assert all(f.reason.startswith("refused:") for f in result.failures)
    assert result.stats.failed == len(hostile)
    files, dirs = local_tree(dest)
    assert files == {"good.txt": b"good"}
    assert dirs == set()
    # nothing was written next to (or above) the destination
    assert sorted(p.name for p in outside.iterdir()) == ["dest"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside"]
    m = Manifest.open(dest)
    assert m.count() == 1
    m.close()


# -- concurrency and streaming -------------------------------------------------------------


async def test_big_files_are_split_and_gets_stay_within_the_budget(tmp_path):
    mem = InMemoryStorageClient()
    for i in range(3):
        mem.put(f"big{i}.bin", pattern_bytes(f"b{i}", 0, BIG))
    in_flight = 0
    peak = 0

    async def before(name: str, start: int) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await trio.sleep(0.001)
        in_flight -= 1

    storage = CountingStorageClient(Hooked(mem, before))
    result = await download(storage, tmp_path / "d", prefix="", transfers=5)
    assert result.ok
    assert storage.statistics().range_requests == 3 * parts(BIG)
    assert peak == 5  # parallel parts, and never more than RSLEX_DOWNLOADER_THREADS
    for i in range(3):
        assert (tmp_path / "d" / f"big{i}.bin").read_bytes() == pattern_bytes(f"b{i}", 0, BIG)


async def test_transfers_start_while_listing_continues_and_listing_waits_for_workers(tmp_path):
    mem = InMemoryStorageClient()
    for i in range(100):
        mem.put(f"f{i:03d}", b"x")
    release = trio.Event()
    first_get = trio.Event()
    lists_at_first_get: list[int] = []

    async def before(name: str, start: int) -> None:
        if not first_get.is_set():
            lists_at_first_get.append(storage.list_requests)
            first_get.set()
        await release.wait()

    storage = CountingStorageClient(Hooked(mem, before))
    run = functools.partial(download, storage, tmp_path / "d", prefix="", transfers=1, page_size=10)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await first_get.wait()
        # the first GET went out after the first page was listed
        assert lists_at_first_get == [1]
        # give the lister every chance to run ahead: with the one worker held, it must stop
        # once the bounded queue (one page) is full, long before the 10 pages are listed
        for _ in range(5):
            await trio.sleep(0.05)
            await trio.testing.wait_all_tasks_blocked()
        assert storage.list_requests <= 3
        release.set()
    assert storage.list_requests == 10
    assert len(os.listdir(tmp_path / "d")) == 100 + 1  # + the manifest


# -- failures ------------------------------------------------------------------------------


def assert_no_partials(dest: Path, expected: dict[str, bytes]) -> None:
    """Every file under a final name is complete, and no temp file is left."""
    files, _ = local_tree(dest)
    for rel, data in files.items():
        assert data == expected[rel], rel
    assert not (dest / TMP_DIR_NAME).exists()


async def test_transient_failures_beyond_the_retries_fail_one_blob_mid_file(tmp_path):
    mem = make_store()
    faulty = FaultyStorageClient(mem)
    queued = False

    async def before(name: str, start: int) -> None:
        nonlocal queued
        if name == "data/big.bin" and start == 5 * PART and not queued:
            queued = True  # every attempt at this part fails: 1 + 2 retries
            faulty.fail_next("get_range", 3, lambda: StorageUnavailable("HTTP 503 ServerBusy"))

    storage = RetryingStorageClient(Hooked(faulty, before), retries=2, base_delay_s=0.0)
    dest = tmp_path / "dest"
    result = await download(storage, dest, transfers=1)

    assert not result.ok
    assert result.stats.failed == 1
    (failure,) = result.failures
    assert failure.blob == "data/big.bin"
    assert "503" in failure.reason
    files, _ = local_tree(dest)
    assert "big.bin" not in files
    assert_no_partials(dest, EXPECTED_FILES)
    assert set(files) == set(EXPECTED_FILES) - {"big.bin"}
    # the rerun fetches only the failed blob
    again = CountingStorageClient(mem)
    assert (await download(again, dest)).ok
    assert again.statistics().range_requests == parts(BIG)
    assert local_tree(dest)[0] == EXPECTED_FILES


async def test_a_blob_deleted_mid_download_fails_without_a_partial_file(tmp_path):
    mem = make_store()

    async def before(name: str, start: int) -> None:
        if name == "data/big.bin" and start == 3 * PART:
            mem.delete(name)

    dest = tmp_path / "dest"
    result = await download(Hooked(mem, before), dest)
    assert [f.blob for f in result.failures] == ["data/big.bin"]
    assert "not found" in result.failures[0].reason
    assert not (dest / "big.bin").exists()
    assert_no_partials(dest, EXPECTED_FILES)


async def test_a_blob_replaced_mid_download_is_fetched_at_its_new_version(tmp_path):
    mem = make_store()
    new = pattern_bytes("new", 0, BIG + 777)
    replaced = False

    async def before(name: str, start: int) -> None:
        nonlocal replaced
        if name == "data/big.bin" and start == 3 * PART and not replaced:
            replaced = True
            mem.put(name, new)

    dest = tmp_path / "dest"
    result = await download(Hooked(mem, before), dest)
    assert result.ok, result.failures
    assert (dest / "big.bin").read_bytes() == new
    assert result.stats.bytes_fetched == sum(map(len, TREE.values())) - BIG + len(new)


async def test_a_listing_that_fails_is_reported_and_what_was_listed_is_kept(tmp_path):
    mem = make_store()
    faulty = FaultyStorageClient(mem)
    storage = RetryingStorageClient(faulty, retries=1, base_delay_s=0.0)

    pages = 0
    real_list_page = faulty.list_page

    async def list_then_fail(prefix, **kw):
        nonlocal pages
        pages += 1
        if pages == 2:
            faulty.fail_next("list_page", 2, StorageUnavailable("connection reset"))
        return await real_list_page(prefix, **kw)

    faulty.list_page = list_then_fail  # type: ignore[method-assign]
    dest = tmp_path / "dest"
    result = await download(storage, dest, page_size=3)
    assert not result.ok
    assert result.fatal is not None
    assert "listing stopped" in result.fatal
    assert "connection reset" in result.fatal
    assert not result.stats.listing_done
    files, _ = local_tree(dest)
    assert 0 < len(files) < len(TREE)
    assert_no_partials(dest, EXPECTED_FILES)


async def test_a_missing_container_is_fatal(tmp_path):
    faulty = FaultyStorageClient(InMemoryStorageClient())
    from blobmount.errors import ContainerNotFound

    faulty.fail_next("list_page", 1, ContainerNotFound("container not found"))
    result = await download(faulty, tmp_path / "d")
    assert not result.ok
    assert "container not found" in (result.fatal or "")


@pytest.mark.parametrize("how", ["corrupt", "short"])
async def test_wrong_bytes_are_caught_retried_and_reported(tmp_path, how):
    mem = InMemoryStorageClient()
    mem.put("f.bin", pattern_bytes("f", 0, 3 * PART))
    mem.put("ok.bin", b"fine")

    class Mangling(Hooked):
        async def get_range(self, name: str, etag: str, start: int, length: int) -> bytes:
            data = await self.inner.get_range(name, etag, start, length)
            if name != "f.bin" or start != PART:
                return data
            if how == "short":
                return data[:-1]
            return bytes([data[0] ^ 0xFF]) + data[1:]

    storage = CountingStorageClient(Mangling(mem, None))  # type: ignore[arg-type]
    dest = tmp_path / "d"
    result = await download(storage, dest, prefix="", verify=True)
    assert [f.blob for f in result.failures] == ["f.bin"]
    reason = result.failures[0].reason
    assert ("Content-MD5 mismatch" if how == "corrupt" else "short read") in reason
    assert storage.statistics().range_requests == 3 * 3 + 1  # three attempts, then give up
    assert_no_partials(dest, {"ok.bin": b"fine"})
    assert (dest / "ok.bin").exists()


async def test_local_conflicts_fail_that_blob_only(tmp_path):
    mem = InMemoryStorageClient()
    mem.put("a.txt", b"a")
    mem.put("x", b"file named x")
    mem.put("x/y", b"needs a folder named x")
    dest = tmp_path / "d"
    (dest / "a.txt").mkdir(parents=True)  # a folder where a file must go
    result = await download(mem, dest, prefix="", transfers=1)
    assert {f.blob for f in result.failures} == {"a.txt", "x/y"}
    assert all(f.reason.startswith("local file error") for f in result.failures)
    assert (dest / "x").read_bytes() == b"file named x"
    assert_no_partials(dest, {"x": b"file named x"})


# -- interruption and resume ---------------------------------------------------------------


async def test_cancelled_after_some_files_leaves_no_partials_and_resumes(tmp_path):
    mem = InMemoryStorageClient()
    expected = {
        f"d{i % 3}/f{i:02d}.bin": pattern_bytes(f"f{i}", 0, 2 * PART + i) for i in range(30)
    }
    for name, data in expected.items():
        mem.put(name, data)
    gets = 0
    dest = tmp_path / "dest"

    with trio.CancelScope() as scope:

        async def before(name: str, start: int) -> None:
            nonlocal gets
            gets += 1
            if gets == 25:  # mid-way through some file: cancel like Ctrl-C would
                scope.cancel()
            await trio.sleep(0)

        downloader = Downloader(Hooked(mem, before), config(dest, prefix="", transfers=3))
        await downloader.run()
    assert scope.cancelled_caught
    assert_no_partials(dest, expected)
    done, _ = local_tree(dest)
    assert 0 < len(done) < len(expected)
    assert downloader.statistics().files_fetched == len(done)
    # the final checkpoint recorded every completed file
    m = Manifest.open(dest)
    assert m.count() == len(done)
    m.close()

    again = CountingStorageClient(mem)
    result = await download(again, dest, prefix="")
    assert result.ok
    assert result.stats.files_skipped == len(done)
    assert result.stats.files_fetched == len(expected) - len(done)
    assert again.statistics().range_requests == 3 * (len(expected) - len(done))
    assert local_tree(dest)[0] == expected


async def test_checkpoints_record_completed_files_while_the_run_goes_on(tmp_path):
    mem = InMemoryStorageClient()
    for i in range(10):
        mem.put(f"f{i}", b"data")
    dest = tmp_path / "dest"
    recorded_mid_run: list[int] = []

    def count() -> int:
        m = Manifest.open(dest)
        try:
            return m.count()
        finally:
            m.close()

    async def before(name: str, start: int) -> None:
        if name == "f9":  # hold the last file until a checkpoint has saved the others
            with trio.fail_after(10):
                while (n := await trio.to_thread.run_sync(count)) < 9:
                    await trio.sleep(0.01)
            recorded_mid_run.append(n)

    result = await download(
        Hooked(mem, before), dest, prefix="", transfers=1, checkpoint_interval_s=0.01
    )
    assert result.ok
    assert recorded_mid_run == [9]
    assert count() == 10


async def test_leftovers_of_a_killed_run_are_cleaned(tmp_path):
    dest = tmp_path / "dest"
    (dest / TMP_DIR_NAME).mkdir(parents=True)
    (dest / TMP_DIR_NAME / "7.part").write_bytes(b"partial")
    mem = InMemoryStorageClient()
    mem.put("f", b"f")
    assert (await download(mem, dest, prefix="")).ok
    assert not (dest / TMP_DIR_NAME).exists()


# -- --verify ------------------------------------------------------------------------------


async def test_verify_checks_content_md5_where_there_is_one(tmp_path):
    mem = make_store()
    mem.put("data/no-md5.bin", b"no md5 here", md5=False)
    dest = tmp_path / "dest"
    result = await download(mem, dest, verify=True)
    assert result.ok
    assert result.stats.md5_verified == len(TREE)
    assert result.stats.md5_missing == 1


async def test_verify_on_a_rerun_hashes_local_copies_instead_of_downloading(tmp_path):
    mem = make_store()
    dest = tmp_path / "dest"
    assert (await download(mem, dest)).ok
    # an edit that keeps size and mtime: only a content check can see it
    target = dest / "x/one-byte-over.bin"
    st = target.stat()
    target.write_bytes(b"Z" * st.st_size)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))

    plain = CountingStorageClient(mem)
    assert (await download(plain, dest)).ok
    assert plain.statistics().range_requests == 0  # without --verify it looks current

    checked = CountingStorageClient(mem)
    result = await download(checked, dest, verify=True)
    assert result.ok
    assert result.stats.files_fetched == 1
    assert checked.statistics().range_requests == parts(PART + 1)
    assert result.stats.md5_verified == len(TREE)
    assert local_tree(dest)[0] == EXPECTED_FILES

    # now every copy is recorded as verified: a third run checks nothing again
    third = CountingStorageClient(mem)
    result = await download(third, dest, verify=True)
    assert third.statistics().range_requests == 0
    assert result.stats.md5_verified == 0


# -- the destination -----------------------------------------------------------------------


async def test_a_destination_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(DestinationError, match="not a folder"):
        await download(InMemoryStorageClient(), tmp_path / "file")


async def test_two_downloads_into_one_folder_are_refused(tmp_path):
    dest = tmp_path / "dest"
    other = Destination(dest)
    other.open()
    try:
        with pytest.raises(DestinationError, match="another blobmount download"):
            await download(InMemoryStorageClient(), dest)
    finally:
        other.close()
    assert (await download(InMemoryStorageClient(), dest)).ok
