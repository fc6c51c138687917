"""Listing at scale through a real mount: lazy first entries, tree walks without a request storm,
and the attribute TTL for blobs added after the mount."""

from __future__ import annotations

import math
import os
import time
import uuid

import pytest

from blobmount.runstate import stats_socket
from blobmount.stats import fetch_stats

pytestmark = [pytest.mark.fuse, pytest.mark.azurite, pytest.mark.timeout(900)]

# Azurite's in-memory store slows down as a container grows (inserts cost O(n): ~200 blobs/s
# here, falling), so 100,000 blobs would take most of a CI run to upload. These sizes keep every
# property visible (first entries after 1 of 2 pages; a walk of 600 folders in 2 flat pages
# instead of 601 folder listings); tests/unit/test_listing_modes.py runs the full sizes
# (100,000 flat, 50,000 in 5,000 folders) through the same filesystem code.
FLAT_BLOBS = 6_000
TREE_FOLDERS, TREE_PER_FOLDER = 600, 10


def list_requests(mountpoint) -> int:
    return fetch_stats(stats_socket(mountpoint))["storage"]["list_requests"]


@pytest.fixture(scope="module")
def flat_container(azurite):
    name = f"flat-{uuid.uuid4().hex[:8]}"
    azurite.create_container(name)
    azurite.put_many(name, ((f"flat/img_{i:07d}.jpg", b"") for i in range(FLAT_BLOBS)))
    return name


@pytest.fixture(scope="module")
def tree_container(azurite):
    name = f"tree-{uuid.uuid4().hex[:8]}"
    azurite.create_container(name)
    azurite.put_many(
        name,
        (
            (f"tree/d{d:05d}/f{f:02d}.jpg", b"x")
            for d in range(TREE_FOLDERS)
            for f in range(TREE_PER_FOLDER)
        ),
    )
    return name


def listing_pages(mountpoint) -> int:
    return fetch_stats(stats_socket(mountpoint))["namespace"]["catalog"]["paged_pages"]


def test_scandir_yields_first_entry_after_one_page(flat_container, mount_factory):
    # The folder is the mount's root: Azurite answers a one-item delimiter listing of a folder
    # *above* thousands of blobs in O(n^2) (49 s for 6,000 here; Azure does not), so the test
    # does not make the mount look at the folder from its parent.
    mnt = mount_factory(flat_container, prefix="flat").mountpoint
    with os.scandir(mnt) as entries:
        first = next(entries)
        assert first.name.startswith("img_")
        assert listing_pages(mnt) == 1  # one page of 5,000 so far, not the whole folder
        rest = sum(1 for _ in entries)
    assert rest + 1 == FLAT_BLOBS
    assert listing_pages(mnt) == math.ceil(FLAT_BLOBS / 5000)


def test_tree_walk_in_flat_mode_costs_a_page_per_5000_blobs(tree_container, mount_factory):
    mnt = mount_factory(
        tree_container, prefix="tree", env={"DATASET_MOUNT_LISTING_MODE": "flat"}
    ).mountpoint
    before = list_requests(mnt)
    files = sum(len(names) for _, _, names in os.walk(mnt))
    assert files == TREE_FOLDERS * TREE_PER_FOLDER
    used = list_requests(mnt) - before
    assert used <= math.ceil(TREE_FOLDERS * TREE_PER_FOLDER / 5000) + 2
    namespace = fetch_stats(stats_socket(mnt))["namespace"]["catalog"]
    assert namespace["walks"] == 1


def test_tree_walk_in_auto_mode_switches_to_flat(tree_container, mount_factory):
    mnt = mount_factory(tree_container, prefix="tree").mountpoint
    before = list_requests(mnt)
    files = sum(len(names) for _, _, names in os.walk(mnt))
    assert files == TREE_FOLDERS * TREE_PER_FOLDER
    used = list_requests(mnt) - before
    # a few folders listed on their own before the walk shows itself, then flat pages
    assert used <= math.ceil(TREE_FOLDERS * TREE_PER_FOLDER / 5000) + 6
    assert used < TREE_FOLDERS / 50


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
