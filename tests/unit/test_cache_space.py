"""Space rules of the cache directory: capacity from the settings, prune threshold and target,
LRU victim choice, and the running budget."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blobmount.cachedir.space import (
    AGE_RESOLUTION_S,
    AgeHistogram,
    CacheBudget,
    SpaceConfig,
    allocated_size,
    capacity_bytes,
    needs_pruning,
    prune_goal_bytes,
    prune_start_bytes,
)
from blobmount.compose.configs import disk_tier_config
from blobmount.settings import load_settings
from blobmount.units import GiB, KiB, MiB

RESERVED = 150 * MiB


def space(cache_size: int | None, reserved: int = RESERVED, threshold=1.0, target=0.7):
    return SpaceConfig(cache_size, reserved, threshold, target)


@pytest.mark.parametrize(
    ("cache_size", "used", "free", "expected"),
    [
        # unlimited: everything the disk has, minus the reserve
        (None, 0, 10 * GiB, 10 * GiB - RESERVED),
        (None, 2 * GiB, 8 * GiB, 10 * GiB - RESERVED),  # what the cache holds counts as room
        # absolute: the setting, unless the disk has less
        (5 * GiB, 0, 10 * GiB, 5 * GiB),
        (5 * GiB, 4 * GiB, 6 * GiB, 5 * GiB),
        (20 * GiB, 0, 10 * GiB, 10 * GiB - RESERVED),
        (0, 0, 10 * GiB, 0),
        # negative: leave that much of the disk free
        (-3 * GiB, 0, 10 * GiB, 7 * GiB),
        (-3 * GiB, 1 * GiB, 9 * GiB, 7 * GiB),
        (-100 * MiB, 0, 10 * GiB, 10 * GiB - RESERVED),  # the reserve is larger: it wins
        (-20 * GiB, 0, 10 * GiB, 0),
        # never negative, even when the disk is already past the reserve
        (None, 0, 100 * MiB, 0),
        (None, 50 * MiB, 50 * MiB, 0),
    ],
)
def test_capacity(cache_size, used, free, expected):
    assert capacity_bytes(space(cache_size), used, free) == expected


def test_reserve_applies_whatever_the_cache_size():
    for cache_size in (None, 100 * GiB, -1 * MiB):
        cfg = space(cache_size, reserved=2 * GiB)
        assert capacity_bytes(cfg, 1 * GiB, 5 * GiB) == 4 * GiB


@given(
    cache_size=st.one_of(st.none(), st.integers(-(2**40), 2**40)),
    reserved=st.integers(0, 2**36),
    used=st.integers(0, 2**40),
    free=st.integers(0, 2**40),
)
def test_capacity_bounds(cache_size, reserved, used, free):
    cfg = space(cache_size, reserved)
    cap = capacity_bytes(cfg, used, free)
    assert cap >= 0
    assert cap <= max(0, used + free - reserved)  # never the last `reserved` bytes
    if cache_size is not None and cache_size >= 0:
        assert cap <= cache_size
    if cache_size is not None and cache_size < 0:
        assert cap <= max(0, used + free + cache_size)  # leaves |cache_size| free
    # more free space never means less capacity
    assert capacity_bytes(cfg, used, free + 1024) >= cap


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512KB", 512 * KiB),
        ("20GB", 20 * GiB),
        ("1.5GB", int(1.5 * GiB)),
        ("-5GB", -5 * GiB),
        ("-512MB", -512 * MiB),
        ("1048576", 1048576),
    ],
)
def test_cache_size_units_reach_the_space_config(text, expected):
    settings = load_settings({"DATASET_MOUNT_CACHE_SIZE": text})
    assert disk_tier_config(settings).space.cache_size == expected


def test_space_config_from_settings_defaults_and_overrides():
    cfg = disk_tier_config(load_settings({})).space
    assert cfg == SpaceConfig(None, 150 * MiB, 1.0, 0.7)
    cfg = disk_tier_config(
        load_settings(
            {
                "DATASET_RESERVED_FREE_DISK_SPACE": "1GB",
                "DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD": "0.9",
                "DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET": "0.5",
            }
        )
    ).space
    assert cfg == SpaceConfig(None, GiB, 0.9, 0.5)


def test_threshold_and_target():
    cfg = space(None, threshold=0.8, target=0.5)
    assert prune_start_bytes(cfg, 1000) == 800
    assert prune_goal_bytes(cfg, 1000) == 500
    assert not needs_pruning(cfg, 799, 1000)
    assert needs_pruning(cfg, 800, 1000)  # "reaches" the threshold
    assert needs_pruning(cfg, 1200, 1000)
    assert not needs_pruning(cfg, 0, 0)  # an empty cache has nothing to prune
    assert needs_pruning(cfg, 1, 0)  # no capacity at all: everything must go


def test_defaults_prune_only_when_full_and_free_thirty_percent():
    cfg = space(None)  # threshold 1.0, target 0.7
    assert not needs_pruning(cfg, 999, 1000)
    assert needs_pruning(cfg, 1000, 1000)
    assert prune_goal_bytes(cfg, 1000) == 700


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reserved_free_bytes": -1}, "reserved"),
        ({"prune_threshold": 0.0}, "threshold"),
        ({"prune_threshold": 1.5}, "threshold"),
        ({"prune_target": 0.95}, "target"),  # above the threshold
        ({"prune_target": -0.1}, "target"),
    ],
)
def test_space_config_refuses_nonsense(kwargs, message):
    args = {"cache_size": None, "reserved_free_bytes": 0, "prune_threshold": 0.9}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        SpaceConfig(**args)


def test_allocated_size_rounds_up_to_the_unit():
    assert allocated_size(0, 4096) == 0
    assert allocated_size(1, 4096) == 4096
    assert allocated_size(4096, 4096) == 4096
    assert allocated_size(2 * MiB + 40, 4096) == 2 * MiB + 4096


def victims(entries, need, max_buckets=4096):
    """Names chosen by an age histogram's cut, asked in the given order (a second walk)."""
    ages = AgeHistogram(max_buckets)
    for _, size, t in entries:
        ages.add(t, size)
    cut = ages.cut(need)
    return [name for name, size, t in entries if cut.take(t, size)]


def test_lru_cut_takes_the_oldest_first_until_enough():
    entries = [("c", 10, 3.0), ("a", 10, 1.0), ("d", 10, 4.0), ("b", 10, 2.0)]  # (name, size, t)
    assert sorted(victims(entries, 15)) == ["a", "b"]
    assert sorted(victims(entries, 20)) == ["a", "b"]
    assert sorted(victims(entries, 21)) == ["a", "b", "c"]
    assert victims(entries, 0) == []
    assert sorted(victims(entries, 40)) == ["a", "b", "c", "d"]
    assert sorted(victims(entries, 1000)) == ["a", "b", "c", "d"]  # more than there is


def test_lru_cut_counts_sizes_not_entries():
    entries = [("big-old", 100, 1.0), ("small-older", 1, 0.5), ("new", 100, 9.0)]
    assert sorted(victims(entries, 51)) == ["big-old", "small-older"]


def test_age_histogram_stays_small_and_roughly_ordered():
    # a million entries written one a second: at most 64 buckets, so the order is kept to
    # within a bucket's width, and pruning still takes from the old end only
    ages = AgeHistogram(max_buckets=64)
    for t in range(1_000_000):
        ages.add(1.7e9 + t, 1)
    assert ages.bucket_count <= 64
    width = 2**ages.shift * AGE_RESOLUTION_S  # seconds
    assert width <= 2 * 1_000_000 / 64
    cut = ages.cut(100_000)
    taken = [t for t in range(1_000_000) if cut.take(1.7e9 + t, 1)]
    assert len(taken) == 100_000
    assert max(taken) < 100_000 + width  # nothing young goes


def test_age_histogram_exact_to_the_millisecond_when_small():
    # a small cache under churn turns over within a second: its order must still hold
    entries = [(f"e{i}", 5, 1000.0 + i * 0.002) for i in range(50)]
    entries.reverse()  # the walk meets them in any order
    assert sorted(victims(entries, 5 * 7), key=lambda n: int(n[1:])) == [f"e{i}" for i in range(7)]


def test_budget_reserves_within_capacity():
    budget = CacheBudget(space(1000, reserved=0))
    assert not budget.known
    assert not budget.try_reserve(1)  # nothing is known before the first reading
    budget.rebase(used_bytes=600, entries=6, room_bytes=10_600)
    assert budget.capacity() == 1000
    assert budget.try_reserve(300)
    assert not budget.try_reserve(101)  # 600 used + 300 reserved + 101 > 1000
    assert budget.try_reserve(100)
    budget.settle(300, 300)
    budget.settle(100, 0)  # a write that did not happen gives its reservation back
    assert (budget.used_bytes, budget.reserved_bytes, budget.entries) == (900, 0, 7)
    budget.removed(500)
    assert (budget.used_bytes, budget.entries) == (400, 6)


def test_budget_room_is_unchanged_by_our_own_writes():
    budget = CacheBudget(space(None, reserved=100))
    budget.rebase(used_bytes=0, entries=0, room_bytes=1000)
    assert budget.capacity() == 900
    assert budget.try_reserve(400)
    budget.settle(400, 400)
    budget.observe_free(600)  # the disk lost what we wrote
    assert budget.capacity() == 900
    budget.observe_free(100)  # another process took 500 bytes
    assert budget.capacity() == 400
    assert budget.should_prune()  # 400 used of 400


def test_a_stale_reading_never_raises_room():
    budget = CacheBudget(space(None, reserved=0))
    budget.rebase(used_bytes=0, entries=0, room_bytes=1000)
    for _ in range(2):
        assert budget.try_reserve(300)
    budget.settle(300, 300)  # write B ends first
    # its reading: A's 300 bytes are already written (not yet settled), so room looks smaller
    budget.observe_free(400)
    assert budget.capacity() == 700  # understated by the write in progress: safe
    budget.settle(300, 300)  # write A ends, with a reading taken before B landed
    budget.observe_free(700)
    assert budget.capacity() == 700  # not 600 + 700
    budget.rebase(used_bytes=600, entries=2, room_bytes=1000)  # the next scan sets it right
    assert budget.capacity() == 1000
