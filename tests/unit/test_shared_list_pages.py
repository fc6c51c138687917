"""SharedListPages: two "processes" (two wrappers over their own clients of one store) see one
view of each folder, and list each page once between them."""

import os

import pytest
import trio
import trio.testing

from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.memory import InMemoryStorageClient
from blobmount.storage.shared_pages import SharedListPages


def names(page):
    return [blob.name for blob in page.blobs]


class Clock:
    def __init__(self):
        self.now = 1_000.0

    def __call__(self):
        return self.now


@pytest.fixture
def store():
    mem = InMemoryStorageClient()
    for i in range(5):
        mem.put(f"d/f{i}", b"x" * i)
    return mem


def two(store, folder, ttl_s=None, clock=None):
    counted = [CountingStorageClient(store), CountingStorageClient(store)]
    return counted, [SharedListPages(c, folder, ttl_s, clock or Clock()) for c in counted]


async def test_a_page_listed_by_one_is_read_by_the_other(store, tmp_path):
    counted, (one, other) = two(store, tmp_path)
    first = await one.list_page("d/", max_results=2)
    store.put("d/a-new", b"new")  # changes the folder after the first process listed it
    store.delete("d/f0")
    seen = await other.list_page("d/", max_results=2)
    assert names(seen) == names(first) == ["d/f0", "d/f1"]
    # the stored page's token leads both to the same second page, listed once
    second = await other.list_page("d/", continuation=seen.continuation, max_results=2)
    again = await one.list_page("d/", continuation=first.continuation, max_results=2)
    assert names(again) == names(second)
    assert [c.list_requests for c in counted] == [1, 1]
    assert (one.shared_hits, other.shared_hits) == (1, 1)


async def test_other_requests_are_other_pages(store, tmp_path):
    counted, (one, other) = two(store, tmp_path)
    await one.list_page("d/", max_results=2)
    await other.list_page("d/", max_results=3)
    await other.list_page("d/", delimiter=None, max_results=2)
    assert [c.list_requests for c in counted] == [1, 2]


async def test_with_a_ttl_a_page_is_listed_again_once_it_expired(store, tmp_path):
    clock = Clock()
    counted, (one, other) = two(store, tmp_path, ttl_s=5.0, clock=clock)
    await one.list_page("d/")
    clock.now += 4
    assert "d/new" not in names(await other.list_page("d/"))  # fresh: the stored one
    store.put("d/new", b"n")
    clock.now += 10
    assert "d/new" in names(await other.list_page("d/"))  # expired: listed again, and stored
    assert "d/new" in names(await one.list_page("d/"))
    assert [c.list_requests for c in counted] == [1, 1]


def held_lists(counted: CountingStorageClient) -> trio.Event:
    """Make `counted`'s list requests wait, after storage answered, until the event is set."""
    release = trio.Event()
    real = counted.list_page

    async def held(*args, **kwargs):
        page = await real(*args, **kwargs)
        await release.wait()
        return page

    counted.list_page = held
    return release


async def test_a_page_being_listed_is_waited_for_not_listed_again(store, tmp_path):
    counted, (one, other) = two(store, tmp_path)
    release_one = held_lists(counted[0])
    got = {}

    async def first():
        got["one"] = await one.list_page("d/")

    async def second():
        got["other"] = await other.list_page("d/")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(second)
        await trio.sleep(0.05)  # the second looks for the page a few times meanwhile
        assert "other" not in got
        release_one.set()
    assert names(got["one"]) == names(got["other"])
    assert [c.list_requests for c in counted] == [1, 0]
    assert not list(tmp_path.glob("*.claim"))


async def test_a_claim_that_ends_without_a_page_or_whose_process_died_is_not_waited_for(
    store, tmp_path
):
    counted, (one, other) = two(store, tmp_path)
    store.delete("d/f0")
    store.delete("d/f1")
    gate = trio.Event()

    async def broken(*args, **kwargs):
        await gate.wait()
        raise RuntimeError("storage said no")

    async def fails():
        with pytest.raises(RuntimeError):
            await one.list_page("d/")

    async def fail_soon():
        await trio.sleep(0.02)
        gate.set()

    counted[0].list_page = broken
    async with trio.open_nursery() as nursery:
        nursery.start_soon(fails)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(fail_soon)
        # the claimer's request fails: the waiter lists it itself
        assert len((await other.list_page("d/")).blobs) == 3
    assert counted[1].list_requests == 1

    # a claim left by a process that was killed (a pid that is not running) is taken over
    request = repr((one.location, "d/", "/", None, 2))
    claim = tmp_path / (one.page_path(request).name + ".claim")
    claim.write_text("999999999")
    counted[0].list_page = CountingStorageClient(store).list_page
    with trio.fail_after(1):
        assert len((await one.list_page("d/", max_results=2)).blobs) == 2
    assert not claim.exists()

    # and so is one whose process died before writing its pid (empty, and not new)
    request = repr((one.location, "d/", "/", None, 3))
    claim = tmp_path / (one.page_path(request).name + ".claim")
    claim.write_text("")
    os.utime(claim, (0, 0))
    with trio.fail_after(1):
        assert len((await one.list_page("d/", max_results=3)).blobs) == 3


async def test_an_unwritable_folder_lists_unshared(store, tmp_path, caplog):
    counted, (one, other) = two(store, tmp_path / "missing")
    assert len((await one.list_page("d/")).blobs) == 5
    assert len((await other.list_page("d/")).blobs) == 5
    assert [c.list_requests for c in counted] == [1, 1]
    assert "cannot be shared" in caplog.text
