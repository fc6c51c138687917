"""The snapshot client lists like the store it was made from, sends no list or properties
request, and pins every read to the recorded version."""

from __future__ import annotations

import logging

import pytest

from blobmount.errors import BlobChanged, BlobNotFound
from blobmount.snapshots.client import SnapshotStorageClient
from blobmount.snapshots.diff import diff
from blobmount.snapshots.format import decode, encode
from blobmount.snapshots.table import table_of
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.memory import InMemoryStorageClient

NAMES = [
    *(f"train/c{c}/img_{i:03d}.jpg" for c in range(7) for i in range(0, 230, 3)),
    "train/c1",  # a blob named like a folder beside it
    "train/c1-extra.txt",  # sorts between "train/c1" and "train/c1/..."
    "train/c1.txt",
    "train/c10/x",
    "val/only.bin",
    "val/sub/deeper/still.bin",
    "top.txt",
    "a b/ünï cødé 文件.txt",
    "a b/+plus",
    "a b/~tilde",
    "x/y/z/",  # a name ending in the delimiter
]
MARKER = "train/empty"  # a folder marker (hdi_isfolder)


def _store() -> InMemoryStorageClient:
    store = InMemoryStorageClient("acct/data")
    for number, name in enumerate(NAMES):
        store.put(name, name.encode() * (number % 5 + 1), md5=number % 2 == 0)
    store.put(MARKER, b"", dir_marker=True)
    return store


async def _snapshot_of(store: InMemoryStorageClient) -> SnapshotStorageClient:
    blobs = []
    token = None
    while True:
        page = await store.list_page("", delimiter=None, continuation=token)
        blobs += page.blobs
        token = page.continuation
        if token is None:
            break
    table = table_of(blobs)
    # through the file format, as a mount gets it
    data = encode(table, source="az://data", location=store.location, prefix="", created=0.0)
    snapshot = decode(data, "test")
    return SnapshotStorageClient(CountingStorageClient(store), snapshot.table, snapshot.header)


async def _list_all(client, prefix, delimiter, max_results):
    found, folders, token, pages = [], [], None, 0
    while True:
        page = await client.list_page(
            prefix, delimiter=delimiter, continuation=token, max_results=max_results
        )
        pages += 1
        found += [
            (b.name, b.size, b.etag, b.content_md5, b.is_dir_marker, round(b.last_modified * 1000))
            for b in page.blobs
        ]
        folders += page.prefixes
        token = page.continuation
        if token is None:
            return found, folders, pages


@pytest.mark.parametrize(
    ("prefix", "delimiter", "max_results"),
    [
        ("", "/", 5000),
        ("", "/", 1),
        ("", None, 7),
        ("train/", "/", 3),
        ("train/c1", "/", 2),
        ("train/c1/", "/", 10),
        ("train/c1/img_1", None, 4),
        ("a b/", "/", 5000),
        ("x/y/", "/", 1),
        ("val/", None, 1),
        ("nothing/", "/", 10),
        ("train/c", "-", 3),
    ],
)
async def test_listing_matches_the_store_it_was_made_from(prefix, delimiter, max_results):
    store = _store()
    snapshot = await _snapshot_of(store)
    got = await _list_all(snapshot, prefix, delimiter, max_results)
    want = await _list_all(store, prefix, delimiter, max_results)
    assert got == want
    assert got[0] or got[1] or prefix == "nothing/"
    counting = snapshot.inner
    assert isinstance(counting, CountingStorageClient)
    assert counting.statistics().requests == 0  # not one request reached storage


async def test_properties_are_the_recorded_ones_and_unknown_names_are_missing():
    store = _store()
    snapshot = await _snapshot_of(store)
    for name in [*NAMES, MARKER]:
        mine, theirs = await snapshot.get_properties(name), await store.get_properties(name)
        assert (mine.name, mine.size, mine.etag, mine.content_md5, mine.is_dir_marker) == (
            theirs.name,
            theirs.size,
            theirs.etag,
            theirs.content_md5,
            theirs.is_dir_marker,
        )
    store.put("train/new-since.jpg", b"new")
    with pytest.raises(BlobNotFound, match="not in the snapshot"):
        await snapshot.get_properties("train/new-since.jpg")
    page = await snapshot.list_page("train/", delimiter="/")
    assert "train/new-since.jpg" not in [b.name for b in page.blobs]


async def test_reads_are_pinned_to_the_recorded_version(caplog):
    store = _store()
    snapshot = await _snapshot_of(store)
    changed, deleted, kept = NAMES[0], NAMES[1], NAMES[2]
    recorded = {n: await snapshot.get_properties(n) for n in (changed, deleted, kept)}
    store.put(changed, b"other bytes")
    store.delete(deleted)
    with caplog.at_level(logging.ERROR):
        with pytest.raises(BlobChanged):
            await snapshot.get_range(changed, recorded[changed].etag, 0, 10)
        with pytest.raises(BlobChanged):
            await snapshot.get_range_with_props(changed, recorded[changed].etag, 0, 10)
        with pytest.raises(BlobChanged, match="deleted since the snapshot"):
            await snapshot.get_range_parts(deleted, recorded[deleted].etag, 0, [4, 4])
    # the listing still shows them as they were; the rest reads normally
    assert (await snapshot.get_properties(changed)).size == recorded[changed].size
    data = await snapshot.get_range(kept, recorded[kept].etag, 0, 1000)
    assert data == (await store.get_range(kept, recorded[kept].etag, 0, 1000))
    logged = [r.getMessage() for r in caplog.records]
    assert sum(changed in line and "changed since the snapshot" in line for line in logged) == 1
    assert sum(deleted in line and "deleted since the snapshot" in line for line in logged) == 1
    assert (snapshot.changed, snapshot.gone) == (2, 1)


async def test_the_reachability_check_asks_for_one_blob_and_never_lists():
    store = _store()
    snapshot = await _snapshot_of(store)
    await snapshot.check_reachable("train/")
    counting = snapshot.inner
    assert isinstance(counting, CountingStorageClient)
    stats = counting.statistics()
    assert (stats.list_requests, stats.properties_requests) == (0, 1)


async def test_diff_names_added_removed_and_changed_blobs():
    store = _store()
    before = (await _snapshot_of(store)).table
    store.put("train/c0/img_000.jpg", b"rewritten")
    store.delete("top.txt")
    store.put("train/zz-new.jpg", b"1")
    after = (await _snapshot_of(store)).table
    changes = diff(before, after)
    assert changes.added == ("train/zz-new.jpg",)
    assert changes.removed == ("top.txt",)
    assert [c.name for c in changes.changed] == ["train/c0/img_000.jpg"]
    assert changes.changed[0].new_size == len(b"rewritten")
    assert diff(after, after).same
