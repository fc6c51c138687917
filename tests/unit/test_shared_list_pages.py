"""SharedListPages: two "processes" (two wrappers over their own clients of one store) see one
view of each folder, and list each page once between them."""

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


async def test_two_at_once_end_up_with_the_same_page(store, tmp_path):
    """Both list before either stored: the second to store takes the first's page."""
    counted, (one, other) = two(store, tmp_path)
    release_one = trio.Event()
    real = counted[0].list_page

    async def held(*args, **kwargs):
        page = await real(*args, **kwargs)
        await release_one.wait()
        return page

    counted[0].list_page = held
    got = {}

    async def first():
        got["one"] = await one.list_page("d/")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)
        await trio.testing.wait_all_tasks_blocked()
        store.put("d/late", b"l")
        got["other"] = await other.list_page("d/")  # listed after the change, stored first
        release_one.set()
    assert names(got["one"]) == names(got["other"])
    assert "d/late" in names(got["one"])


async def test_an_unwritable_folder_lists_unshared(store, tmp_path, caplog):
    counted, (one, other) = two(store, tmp_path / "missing")
    assert len((await one.list_page("d/")).blobs) == 5
    assert len((await other.list_page("d/")).blobs) == 5
    assert [c.list_requests for c in counted] == [1, 1]
    assert "cannot be shared" in caplog.text
