"""Whole-file caches of two processes of one mount (`multiproc.whole_file_copies`), played by
two caches over one cache folder in this process: a version is downloaded once for the mount
whichever cache opens it, first or at the same time; a claimer that fails or died leaves the
download to the waiter; an entry another cache wrote is used without checking it again."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from blobmount.claims import Claim
from blobmount.errors import StorageUnavailable
from blobmount.multiproc.whole_file_copies import SiblingCopies, entry_key
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.faulty import FaultyStorageClient
from blobmount.storage.memory import InMemoryStorageClient
from blobmount.testing.pattern import pattern_bytes
from blobmount.wholefile.cache import WholeFileCache, open_whole_file_cache
from tests.unit.test_whole_file import LOC, MiB, config, read_all, version

SMALL = 20_000  # served from memory, its entry written after the open
LARGE = 3 * MiB  # written to its entry before the open returns


class GatedStorage(CountingStorageClient):
    """Counts GETs; each waits for `gate` while it is not set."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.gate = trio.Event()
        self.gate.set()

    async def get_range_with_props(self, *args, **kwargs):
        await self.gate.wait()
        return await super().get_range_with_props(*args, **kwargs)


@asynccontextmanager
async def two_caches(
    tmp_path: Path, storage
) -> AsyncIterator[tuple[WholeFileCache, WholeFileCache, SiblingCopies]]:
    """Process 0's and process 1's caches, over one cache folder and one shared record."""
    shared = tmp_path / "shm"
    shared.mkdir()
    first = SiblingCopies.create(shared, 2)
    first.bind(0)
    second = copy.copy(first)  # the other process's view of the same files
    second.bind(1)
    try:
        async with (
            open_whole_file_cache(storage, config(tmp_path / "cache"), LOC, siblings=first) as a,
            open_whole_file_cache(storage, config(tmp_path / "cache"), LOC, siblings=second) as b,
        ):
            assert a is not None
            assert b is not None
            await trio.testing.wait_all_tasks_blocked()  # both scanned the empty folder
            yield a, b, first
    finally:
        first.close()


def store(size: int, name: str = "f.bin") -> tuple[InMemoryStorageClient, bytes]:
    mem = InMemoryStorageClient()
    data = pattern_bytes(name, 0, size)
    mem.put(name, data)
    return mem, data


async def settled(cache: WholeFileCache) -> None:
    await cache.writer.settled()
    await trio.testing.wait_all_tasks_blocked()


@pytest.mark.parametrize("size", [SMALL, LARGE])
async def test_a_version_one_process_downloaded_is_opened_by_the_other_without_a_request(
    tmp_path, size
):
    mem, data = store(size)
    storage = CountingStorageClient(mem)
    async with two_caches(tmp_path, storage) as (a, b, _):
        first = await a.open(version(mem, "f.bin"))
        assert await read_all(a, first) == data
        a.release(first)
        await settled(a)
        requests = storage.statistics().range_requests
        # b's own presence filter never saw the entry: the shared record says it is there
        second = await b.open(version(mem, "f.bin"))
        assert await read_all(b, second) == data
        b.release(second)
        assert storage.statistics().range_requests == requests
        assert (a.statistics().downloads, b.statistics().downloads) == (1, 0)
        assert b.statistics().other_process_copies == 1
        assert storage.statistics().properties_requests == 0  # not checked again


@pytest.mark.parametrize("size", [SMALL, LARGE])
async def test_opens_of_one_version_in_both_processes_at_once_download_it_once(tmp_path, size):
    mem, data = store(size)
    storage = GatedStorage(mem)
    storage.gate = trio.Event()
    got: list[bytes] = []

    async def opener(cache: WholeFileCache) -> None:
        opened = await cache.open(version(mem, "f.bin"))
        got.append(await read_all(cache, opened))
        cache.release(opened)

    async with two_caches(tmp_path, storage) as (a, b, _), trio.open_nursery() as nursery:
        nursery.start_soon(opener, a)
        await trio.testing.wait_all_tasks_blocked()  # a has claimed it and waits for its GET
        nursery.start_soon(opener, b)
        await trio.sleep(0.05)  # b finds the claim and waits for a's entry
        storage.gate.set()
    assert got == [data, data]
    assert a.statistics().downloads + b.statistics().downloads == 1
    assert b.statistics().other_process_copies == 1
    assert storage.statistics().range_requests == -(-size // (256 * 1024))


async def test_a_claimer_whose_download_fails_leaves_the_download_to_the_waiter(tmp_path):
    mem, data = store(SMALL)
    faulty = FaultyStorageClient(mem)
    storage = GatedStorage(faulty)
    storage.gate = trio.Event()
    outcome: dict[str, object] = {}

    async def opener(cache: WholeFileCache, who: str) -> None:
        try:
            opened = await cache.open(version(mem, "f.bin"))
        except StorageUnavailable as exc:
            outcome[who] = exc
            return
        outcome[who] = await read_all(cache, opened)
        cache.release(opened)

    async with two_caches(tmp_path, storage) as (a, b, _), trio.open_nursery() as nursery:
        faulty.fail_next("get_range", 1, StorageUnavailable("storage said no"))
        nursery.start_soon(opener, a, "a")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(opener, b, "b")
        await trio.sleep(0.05)
        storage.gate.set()
    assert isinstance(outcome["a"], StorageUnavailable)
    assert outcome["b"] == data
    assert (a.statistics().downloads, b.statistics().downloads) == (0, 1)


async def test_the_claim_of_a_process_that_died_is_taken_over(tmp_path):
    mem, data = store(SMALL)
    storage = CountingStorageClient(mem)
    async with two_caches(tmp_path, storage) as (a, b, siblings):
        entry = Path(a.path(version(mem, "f.bin"))).name
        (tmp_path / "shm" / "whole-files" / entry).write_text("999999999")  # a pid not running
        with trio.fail_after(5):
            opened = await b.open(version(mem, "f.bin"))
        assert await read_all(b, opened) == data
        b.release(opened)
        await settled(b)
        assert b.statistics().downloads == 1
        # the entry is recorded for the others, and the claim is gone
        assert siblings.wrote(entry)
        assert siblings.claim(entry) is Claim.OURS
        siblings.release(entry)


def test_entry_keys_are_never_the_empty_or_removed_slot():
    assert entry_key("0" * 40) == 2
    assert entry_key("f" * 40) == (1 << 64) - 1
