"""Listing at the issue's scale through a real mount of Azurite: a flat folder of 100,000 blobs
(first entries after one list page, then all of them), a tree of 50,000 blobs in 5,000 folders
walked with a list request per 5,000 blobs, and the attribute TTL for blobs added after the
mount.

Azurite's own inserts are O(n) (about 70 blobs/s by 50,000), so the big datasets are written
straight into an on-disk Azurite's database (tests/helpers/azurite_seed.py, ~15 s for both)
and a few seeded blobs are read back through Azurite's API before any test uses them.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Iterator

import pytest

from blobmount.runstate import stats_socket
from blobmount.stats import fetch_stats
from blobmount.testing.azurite import AzuriteServer
from tests.helpers.azurite_seed import SeededAzurite
from tests.helpers.single_process import LISTS_PER_PROCESS

pytestmark = [pytest.mark.fuse, pytest.mark.azurite, pytest.mark.timeout(900)]

FLAT_BLOBS = 100_000
TREE_FOLDERS, TREE_PER_FOLDER = 5_000, 10
PAGE = 5_000


def flat_blobs() -> list[tuple[str, bytes]]:
    return [(f"flat/img_{i:07d}.jpg", f"flat {i}\n".encode()) for i in range(FLAT_BLOBS)]


def tree_blobs() -> list[tuple[str, bytes]]:
    return [
        (f"tree/d{d:05d}/f{f:02d}.jpg", f"tree {d} {f}\n".encode())
        for d in range(TREE_FOLDERS)
        for f in range(TREE_PER_FOLDER)
    ]


@pytest.fixture(scope="module")
def seeded(azurite) -> Iterator[AzuriteServer]:
    """An Azurite of its own holding containers `flat` and `tree`, a few of whose blobs it has
    read back (the session's Azurite is asked for only to skip when Azurite is missing)."""
    with SeededAzurite({"flat": flat_blobs(), "tree": tree_blobs()}) as az:
        yield az


@pytest.fixture
def mount_seeded(seeded, mount_factory):
    def mount(container: str, prefix: str, env: dict[str, str] | None = None):
        return mount_factory(
            container,
            prefix=prefix,
            env={"AZURE_STORAGE_CONNECTION_STRING": seeded.connection_string, **(env or {})},
            base_url=seeded.account_url,
        )

    return mount


def stats(mountpoint):
    return fetch_stats(stats_socket(mountpoint))


def list_requests(mountpoint) -> int:
    """Every list request the mount made, counted when sent; the first is the source check
    at start-up (a one-item listing)."""
    return stats(mountpoint)["storage"]["list_requests"]


def listing_pages(mountpoint) -> int:
    return stats(mountpoint)["namespace"]["catalog"]["paged_pages"]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1])


@LISTS_PER_PROCESS
def test_scandir_of_100000_blobs_yields_the_first_entry_after_one_page(mount_seeded):
    # The folder is the mount's root: Azurite answers a one-item delimiter listing of a folder
    # *above* thousands of blobs in O(n^2) (Azure does not), so the test never makes the mount
    # look at this folder from its parent.
    daemon = mount_seeded("flat", "flat")
    mnt = daemon.mountpoint
    rss_before = rss_kib(daemon.pid)
    with os.scandir(mnt) as entries:
        first = next(entries)
        assert first.name == "img_0000000.jpg"
        # one page of 5,000 asked for so far (after the start-up check), not the whole folder
        assert (list_requests(mnt), listing_pages(mnt)) == (2, 1)
        rss_first_page = rss_kib(daemon.pid)
        names = [first.name, *(entry.name for entry in entries)]
    assert names == [f"img_{i:07d}.jpg" for i in range(FLAT_BLOBS)]
    assert listing_pages(mnt) == math.ceil(FLAT_BLOBS / PAGE)
    assert list_requests(mnt) == 1 + math.ceil(FLAT_BLOBS / PAGE)
    rss_after = rss_kib(daemon.pid)
    print(
        f"daemon RSS: +{(rss_first_page - rss_before) / 1024:.0f} MiB for the first page, then "
        f"{(rss_after - rss_first_page) * 1024 / (FLAT_BLOBS - PAGE):.0f} bytes per entry"
    )
    # the entries are files with the seeded bytes
    for i in (0, 54_321, FLAT_BLOBS - 1):
        assert (mnt / f"img_{i:07d}.jpg").read_bytes() == f"flat {i}\n".encode()


@LISTS_PER_PROCESS
def test_a_reader_that_stops_early_stops_the_listing(mount_seeded):
    mnt = mount_seeded("flat", "flat").mountpoint
    with os.scandir(mnt) as entries:
        for _ in range(100):
            next(entries)
    time.sleep(0.5)  # nothing may go on listing in the background
    assert (list_requests(mnt), listing_pages(mnt)) == (2, 1)


@LISTS_PER_PROCESS
def test_tree_walk_in_flat_mode_costs_a_page_per_5000_blobs(mount_seeded):
    mnt = mount_seeded("tree", "tree", env={"DATASET_MOUNT_LISTING_MODE": "flat"}).mountpoint
    walked = {
        os.path.relpath(os.path.join(folder, name), mnt)
        for folder, _, names in os.walk(mnt)
        for name in names
    }
    assert walked == {name.removeprefix("tree/") for name, _ in tree_blobs()}
    used = list_requests(mnt)  # for the mount's whole life, start-up check included
    assert used <= math.ceil(TREE_FOLDERS * TREE_PER_FOLDER / PAGE) + 2
    catalog = stats(mnt)["namespace"]["catalog"]
    assert (catalog["walks"], catalog["paged_pages"]) == (1, 0)
    print(f"flat mode: os.walk of {len(walked):,} files in {TREE_FOLDERS:,} folders: {used} lists")
    assert (mnt / "d04321/f07.jpg").read_bytes() == b"tree 4321 7\n"


@LISTS_PER_PROCESS
def test_tree_walk_in_auto_mode_switches_to_flat(mount_seeded):
    mnt = mount_seeded("tree", "tree").mountpoint
    files = sum(len(names) for _, _, names in os.walk(mnt))
    assert files == TREE_FOLDERS * TREE_PER_FOLDER
    used = list_requests(mnt)  # for the mount's whole life, start-up check included
    # the root's own pages and a few folders listed on their own before the walk shows itself,
    # then flat pages: nowhere near one request per folder
    assert used <= math.ceil(TREE_FOLDERS * TREE_PER_FOLDER / PAGE) + 6
    assert stats(mnt)["namespace"]["catalog"]["walks"] == 1
    print(f"auto mode: os.walk of {files:,} files in {TREE_FOLDERS:,} folders: {used} lists")


def test_blob_added_after_mount_appears_after_the_ttl(azurite, mount_factory):
    name = f"ttl-{uuid.uuid4().hex[:8]}"
    azurite.create_container(name)
    azurite.upload(name, "dir/old.txt", b"old")
    with_ttl = mount_factory(name, env={"DATASET_MOUNT_ATTRIBUTE_CACHE_TTL": "1000"})
    fixed = mount_factory(name)
    for daemon in (with_ttl, fixed):
        assert os.listdir(daemon.mountpoint / "dir") == ["old.txt"]
        assert not (daemon.mountpoint / "dir/new.txt").exists()
    azurite.upload(name, "dir/new.txt", b"new")
    time.sleep(1.5)
    assert sorted(os.listdir(with_ttl.mountpoint / "dir")) == ["new.txt", "old.txt"]
    assert (with_ttl.mountpoint / "dir/new.txt").read_bytes() == b"new"
    # without a TTL the view is fixed for the life of the mount
    assert os.listdir(fixed.mountpoint / "dir") == ["old.txt"]
    assert not (fixed.mountpoint / "dir/new.txt").exists()
