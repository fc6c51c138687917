"""The synthetic source lists and serves like a real store holding the same blobs."""

from __future__ import annotations

import pytest
import trio

from blobmount.errors import BlobChanged, BlobNotFound, SourceError
from blobmount.storage.memory import InMemoryStorageClient
from blobmount.storage.synthetic import (
    PATTERN_SIZE,
    SyntheticDataset,
    SyntheticStorageClient,
    expected_bytes,
)

DATASET = SyntheticDataset(
    small_files=2_345, small_size=3_000, per_folder=100, large_files=3, large_size=9_000
)


def _twin(dataset: SyntheticDataset) -> InMemoryStorageClient:
    """An in-memory store with the same names (its bytes and ETags differ: listing only)."""
    store = InMemoryStorageClient()
    for index in range(dataset.files):
        store.put(dataset.name(index), b"x" * dataset.size(index))
    return store


async def _list_all(client, prefix, delimiter, max_results):
    names, folders, token = [], [], None
    while True:
        page = await client.list_page(
            prefix, delimiter=delimiter, continuation=token, max_results=max_results
        )
        names += [(b.name, b.size) for b in page.blobs]
        folders += page.prefixes
        token = page.continuation
        if token is None:
            return names, folders


@pytest.mark.parametrize(
    ("prefix", "delimiter", "max_results"),
    [
        ("", "/", 5000),
        ("", None, 1000),
        ("small/", "/", 7),
        ("small/d0003/", "/", 33),
        ("small/d0023/", "/", 5000),
        ("large/", "/", 2),
        ("small/d00", None, 250),
        ("nothing/", "/", 10),
    ],
)
async def test_listing_matches_a_real_store_with_the_same_names(prefix, delimiter, max_results):
    synthetic = SyntheticStorageClient(DATASET)
    got = await _list_all(synthetic, prefix, delimiter, max_results)
    want = await _list_all(_twin(DATASET), prefix, delimiter, max_results)
    assert got == want
    assert got != ([], []) or prefix == "nothing/"


async def test_every_range_is_the_expected_pattern_and_files_differ():
    client = SyntheticStorageClient(DATASET)
    first, second = DATASET.name(0), DATASET.name(1)
    a = await client.get_range(first, DATASET.etag(0), 0, 10_000)
    assert len(a) == 3_000  # cut at the end of the blob
    assert a == expected_bytes(DATASET, first, 0, 3_000)
    assert a[1000:1100] == await client.get_range(first, DATASET.etag(0), 1000, 100)
    assert a != await client.get_range(second, DATASET.etag(1), 0, 3_000)
    large = DATASET.name(DATASET.small_files + 2)
    tail = await client.get_range(large, DATASET.etag(DATASET.small_files + 2), 8_000, 4_096)
    assert tail == expected_bytes(DATASET, large, 8_000, 1_000)


def test_ranges_longer_than_the_pattern_continue_it():
    dataset = SyntheticDataset(small_files=0, large_files=1, large_size=3 * PATTERN_SIZE)
    whole = expected_bytes(dataset, "large/f000.bin", 0, 3 * PATTERN_SIZE)
    assert len(whole) == 3 * PATTERN_SIZE
    assert whole[PATTERN_SIZE + 5 : PATTERN_SIZE + 105] == whole[5:105]
    # a block read at a power-of-two offset never equals another block of the same file
    block = 1 << 20
    assert whole[:block] != whole[4 * block : 5 * block]


async def test_pinned_versions_and_missing_blobs_fail_like_azure():
    client = SyntheticStorageClient(DATASET)
    with pytest.raises(BlobChanged):
        await client.get_range(DATASET.name(5), DATASET.etag(6), 0, 10)
    with pytest.raises(BlobNotFound):
        await client.get_range("small/d0000/f9999999.bin", '"0x0"', 0, 10)
    with pytest.raises(BlobNotFound):
        await client.get_properties("small/d0001/f0000005.bin")  # file 5 lives in d0000
    props = await client.get_properties(DATASET.name(150))
    assert (props.name, props.size, props.etag) == (
        "small/d0001/f0000150.bin",
        3_000,
        DATASET.etag(150),
    )


def test_two_builds_of_one_uri_agree_and_seeds_differ():
    one = SyntheticDataset.from_query("small_files=10&small_size=2KB&seed=7")
    two = SyntheticDataset.from_query("seed=7&small_size=2048&small_files=10")
    assert one == two
    assert one.etag(3) == two.etag(3)
    other = SyntheticDataset(small_files=10, small_size=2048, seed=8)
    assert expected_bytes(one, one.name(3), 0, 64) != expected_bytes(other, other.name(3), 0, 64)


@pytest.mark.parametrize(
    ("query", "complaint"),
    [
        ("small_files=ten", "is not a non-negative whole number"),
        ("colour=blue", "has no setting 'colour'"),
        ("per_folder=0", "per_folder must be at least 1"),
        ("small_files=-1", "is not a non-negative whole number"),
        ("seed=1&seed=2", "sets seed twice"),
        ("large_files=1001", "at most"),
    ],
)
def test_a_bad_query_is_refused_with_what_was_wrong(query, complaint):
    with pytest.raises(SourceError, match=complaint):
        SyntheticDataset.from_query(query)


def test_the_same_name_in_another_dataset_has_another_etag():
    # the disk cache keys entries by (location, name, ETag): another size or file count must
    # not find this dataset's bytes under the same name
    base = SyntheticDataset(small_files=10, small_size=2_000, large_files=1, large_size=5_000)
    resized = SyntheticDataset(small_files=10, small_size=3_000, large_files=1, large_size=5_000)
    shifted = SyntheticDataset(small_files=11, small_size=2_000, large_files=1, large_size=5_000)
    assert base.name(0) == resized.name(0)
    assert base.etag(0) != resized.etag(0)
    assert base.name(10) == shifted.name(11) == "large/f000.bin"
    assert base.etag(10) != shifted.etag(11)
    assert expected_bytes(base, "large/f000.bin", 0, 64) != expected_bytes(
        shifted, "large/f000.bin", 0, 64
    )


async def test_latency_us_delays_each_get_by_that_long_and_nothing_else(autojump_clock):
    dataset = SyntheticDataset.from_query("small_files=3&small_size=100&latency_us=1500")
    client = SyntheticStorageClient(dataset)
    name = dataset.name(1)
    started = trio.current_time()
    await client.list_page("small/")
    await client.get_properties(name)
    assert trio.current_time() == started  # no wait for listings or properties
    got = await client.get_range_with_props(name, dataset.etag(1), 0, 100)
    assert got.data == expected_bytes(dataset, name, 0, 100)
    assert trio.current_time() - started == pytest.approx(0.0015)
    with pytest.raises(SourceError, match="latency_us is at most"):
        SyntheticDataset.from_query("latency_us=10000001")
