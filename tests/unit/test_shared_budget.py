"""The cache budget's figures shared by the processes of a mount (`SharedBudgetCounters`), across
real forked processes. Reservations racing in two processes never add up to more than the
capacity. The figures stay consistent. A scan's rebase keeps every process's reservations and
counts what the others wrote while it ran. A killed process's reservations come back. Two disk
tiers in two processes keep the folder within DATASET_MOUNT_CACHE_SIZE.

Every child leaves through os._exit (its status says whether its own checks passed), and every
wait has a deadline, so a failure cannot hang the test run."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import trio

from blobmount.blocks.disk_tier import DiskTierConfig, open_block_disk_tier
from blobmount.blocks.keys import BlockKey
from blobmount.cachedir.layout import CacheLayout
from blobmount.cachedir.pruner import Pruner, PrunerConfig
from blobmount.cachedir.shared_budget import SLOTS, BudgetFigures, SharedBudgetCounters
from blobmount.cachedir.space import CacheBudget, SpaceConfig
from blobmount.testing.pattern import pattern_bytes
from blobmount.units import KiB, MiB
from tests.helpers.forked import WAIT_S, fork, read_line, wait

pytestmark = pytest.mark.timeout(120)


def word(fd: int) -> str:
    return read_line(fd).decode().strip()


def say(fd: int, text: object) -> None:
    os.write(fd, f"{text}\n".encode())


@pytest.fixture
def counters(tmp_path: Path):
    shared = SharedBudgetCounters.create(tmp_path)
    yield shared
    shared.close()


def space(cache_size: int | None) -> SpaceConfig:
    return SpaceConfig(cache_size, 0, 1.0, 0.7)


# -- the counters ------------------------------------------------------------------------------


def test_racing_reservations_of_two_processes_fill_the_capacity_exactly(counters):
    """Each of two processes tries to reserve 1000 x 1 MiB of a 300 MiB capacity at the same
    moment, then settles what it got as written."""
    capacity, tries = 300 * MiB, 1000
    go_read, go_write = os.pipe()
    answer_read, answer_write = os.pipe()

    def child() -> None:
        os.close(go_write)
        assert os.read(go_read, 1) == b"g"  # both start together
        got = sum(counters.try_reserve(MiB, capacity) for _ in range(tries))
        assert counters.read().own_reserved_bytes == got * MiB
        for _ in range(got):
            counters.settle(MiB, MiB)
        assert counters.read().own_reserved_bytes == 0
        say(answer_write, got)

    pids = [fork(child) for _ in range(2)]
    os.write(go_write, b"gg")
    got = [int(word(answer_read)) for _ in pids]
    assert [wait(pid) for pid in pids] == [0, 0]
    assert sum(got) == 300  # never more; and no reservation was lost to a race either
    assert counters.read() == BudgetFigures(300 * MiB, 300, 0, 0)


def test_threads_of_one_process_do_not_race_either(counters):
    capacity = 100 * MiB
    results: list[int] = []

    def reserve() -> None:
        results.append(sum(counters.try_reserve(MiB, capacity) for _ in range(500)))

    threads = [threading.Thread(target=reserve) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert sum(results) == 100
    assert counters.read() == BudgetFigures(0, 0, 100 * MiB, 100 * MiB)


def test_rebase_keeps_the_reservations_and_counts_what_others_settled_meanwhile(counters):
    assert counters.try_reserve(100, 10_000)
    counters.settle(0, 40)  # a write that ended before the scan started: the scan sees it
    mark = counters.mark()  # the scan starts
    answer_read, answer_write = os.pipe()

    def other() -> None:
        assert counters.try_reserve(30, 10_000)
        counters.settle(30, 30)  # another process's write lands while the scan walks
        assert counters.try_reserve(7, 10_000)  # and one stays in progress
        say(answer_write, "done")
        time.sleep(WAIT_S)  # held until the parent has looked

    pid = fork(other)
    try:
        word(answer_read)
        counters.settle(0, 5)  # this process's own: its pruner counts those itself
        counters.rebase(1000, 10, since=mark)
        # 1000 scanned + 30 the other process settled; reservations 100 + 7 kept
        assert counters.read() == BudgetFigures(1030, 11, 107, 100)
        counters.rebase(900, 9)  # without a mark: the scan's figures as they are
        assert counters.read() == BudgetFigures(900, 9, 107, 100)
    finally:
        os.kill(pid, signal.SIGKILL)
        wait(pid)


def reserving_process(counters: SharedBudgetCounters, size: int, capacity: int) -> int:
    """The pid of a forked process that has reserved `size` bytes and holds them until it is
    killed."""
    answer_read, answer_write = os.pipe()

    def holder() -> None:
        assert counters.try_reserve(size, capacity)
        say(answer_write, "reserved")
        time.sleep(WAIT_S)

    pid = fork(holder)
    assert word(answer_read) == "reserved"
    return pid


def test_a_killed_process_reservations_come_back(counters):
    pid = reserving_process(counters, 600, 1000)
    assert counters.try_reserve(300, 1000)
    assert not counters.try_reserve(101, 1000)  # 600 of the other process + 300 + 101
    os.kill(pid, signal.SIGKILL)
    assert wait(pid) == -signal.SIGKILL
    counters.rebase(0, 0)  # the next scan finds the owner gone
    assert counters.read() == BudgetFigures(0, 0, 300, 300)
    assert counters.try_reserve(700, 1000)


def test_slots_of_processes_that_ended_are_taken_again(counters):
    for _ in range(SLOTS + 6):
        pid = fork(lambda: counters.attach())
        assert wait(pid) == 0
    counters.attach()  # the parent still finds a slot


def test_a_write_that_never_settles_is_given_back_when_its_process_closes(tmp_path):
    counters = SharedBudgetCounters.create(tmp_path)

    def child() -> None:
        assert counters.try_reserve(500, 1000)
        counters.close()

    assert wait(fork(child)) == 0
    assert counters.read() == BudgetFigures(0, 0, 0, 0)
    counters.close()


# -- budgets over the counters -------------------------------------------------------------------


def test_two_budgets_in_two_processes_see_each_other(counters):
    budget = CacheBudget(space(1000), counters)
    budget.rebase(used_bytes=200, entries=2, room_bytes=100_000)
    to_child_read, to_child_write = os.pipe()
    answer_read, answer_write = os.pipe()

    def child() -> None:
        mine = CacheBudget(space(1000), counters)
        mine.rebase(used_bytes=200, entries=2, room_bytes=100_000)
        assert mine.try_reserve(500)
        say(answer_write, "reserved")
        assert os.read(to_child_read, 1) == b"s"
        mine.settle(500, 480)
        say(answer_write, "settled")
        assert os.read(to_child_read, 1) == b"q"
        # the parent's reservation counts here too
        assert (mine.used_bytes, mine.reserved_bytes, mine.own_reserved_bytes) == (680, 300, 0)
        assert not mine.try_reserve(21)

    pid = fork(child)
    try:
        assert word(answer_read) == "reserved"
        assert (budget.reserved_bytes, budget.own_reserved_bytes) == (500, 0)
        assert budget.others_reserved_bytes == 500
        assert not budget.try_reserve(301)  # 200 + 500 + 301 > 1000
        assert budget.try_reserve(300)
        assert budget.should_prune()  # 1000 of 1000, with the other process's write
        os.write(to_child_write, b"s")
        assert word(answer_read) == "settled"
        assert (budget.used_bytes, budget.entries, budget.reserved_bytes) == (680, 3, 300)
        os.write(to_child_write, b"q")
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        wait(pid)
        raise
    assert wait(pid) == 0


def test_pruner_reports_this_process_reservations_and_takes_the_shared_budget(tmp_path, counters):
    pruner = Pruner(
        CacheLayout(tmp_path / "c"), PrunerConfig(space(10_000)), shared_budget=counters
    )
    pruner.budget.rebase(0, 0, 100_000)
    pid = reserving_process(counters, 4000, 10_000)
    try:
        assert pruner.budget.try_reserve(1000)
        stats = pruner.statistics()
        assert (stats.reserved_bytes, pruner.budget.reserved_bytes) == (1000, 5000)
    finally:
        os.kill(pid, signal.SIGKILL)
        wait(pid)


def test_a_budget_without_shared_counters_is_its_own():
    budget = CacheBudget(space(1000))
    budget.rebase(used_bytes=100, entries=1, room_bytes=10_000)
    assert budget.settled_mark() is None
    assert budget.try_reserve(300)
    assert (budget.reserved_bytes, budget.own_reserved_bytes, budget.others_reserved_bytes) == (
        300,
        300,
        0,
    )


# -- two disk tiers, one folder --------------------------------------------------------------------

BLOCK = 64 * KiB
LOC = "account/container"


def test_two_processes_writing_blocks_keep_the_folder_within_the_cache_size(tmp_path):
    """What the shared budget is for. Two disk tiers over one folder each write two thirds of
    the cache size, after both scanned it empty. Each alone would see room for all of its
    blocks and never prune (unshared: 32 blocks of 24 are left on disk). Sharing, the second
    one's reservations find the first one's, so they prune first."""
    root = tmp_path / "cache"
    cache_size = 24 * (BLOCK + 4 * KiB)  # 24 blocks, each with its header and allocation unit
    config = DiskTierConfig(
        enabled=True,
        root=root,
        block_size=BLOCK,
        space=space(cache_size),
        max_queue_bytes=16 * BLOCK,
        write_threads=2,
        read_threads=1,
        rescan_interval_s=300.0,
        drain_timeout_s=10.0,
    )
    counters = SharedBudgetCounters.create(tmp_path)
    CacheLayout(root).prepare("blocks", LOC)  # made once, before the processes race
    go_read, go_write = os.pipe()
    answer_read, answer_write = os.pipe()

    def writer(name: str) -> None:
        async def write_all() -> None:
            async with open_block_disk_tier(config, LOC, shared_budget=counters) as tier:
                assert tier is not None
                await tier.pruner.ready.wait()
                say(answer_write, "scanned")
                assert await trio.to_thread.run_sync(os.read, go_read, 1) == b"g"
                for i in range(16):
                    while tier.writer.statistics().queued_blocks >= 4:
                        await trio.sleep(0.001)
                    tier.put(BlockKey(name, '"0x1"', i), pattern_bytes(f"{name}{i}", 0, BLOCK))
                with trio.fail_after(WAIT_S):
                    while tier.writer.statistics().queued_blocks:
                        await trio.sleep(0.002)
            # closed: its writer drained and its pruner stopped, so no pass of it changes the
            # folder or the figures while the parent compares them
            say(answer_write, "written")
            assert await trio.to_thread.run_sync(os.read, go_read, 1) == b"q"

        trio.run(write_all)

    pids = [fork(lambda name=name: writer(name)) for name in ("a/blob", "b/blob")]
    try:
        assert [word(answer_read) for _ in pids] == ["scanned"] * 2
        os.write(go_write, b"gg")
        assert [word(answer_read) for _ in pids] == ["written"] * 2
        scan = CacheLayout(root).scan(remove_stale_temporaries=False)
        used, _, reserved, _ = counters.read()
        os.write(go_write, b"qq")
    except BaseException:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        raise
    finally:
        results = [wait(pid) for pid in pids]
        counters.close()
    assert results == [0, 0]
    assert 0 < scan.used_bytes <= cache_size
    assert reserved == 0
    assert used >= scan.used_bytes  # the figures may err high until a scan, never low
