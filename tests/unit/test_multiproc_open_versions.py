"""SharedOpenVersions: the page-cache rules of open versions, one record per inode for every
process of a mount. The rules in one process, eviction in a small table (never keep_cache for
an inode whose record is gone), and processes forked after `create` sharing it."""

from __future__ import annotations

import os
import random
import select
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from blobmount.multiproc import lock_time
from blobmount.multiproc.open_versions import SLOT_BYTES, SharedOpenVersions
from tests.helpers.forked import fork, wait

KEEP = (True, False)
FRESH = (False, False)  # may not keep pages, reads through the page cache
DIRECT = (False, True)
TIMEOUT_S = 30.0


@pytest.fixture
def table(tmp_path) -> Iterator[SharedOpenVersions]:
    versions = SharedOpenVersions.create(tmp_path)
    yield versions
    versions.close()


# -- one process -----------------------------------------------------------------------------


def test_the_rules_in_one_process(table):
    assert table.opened(5, "A") == FRESH  # nothing known: the kernel may hold other pages
    assert table.opened(5, "A") == KEEP
    assert table.open_count(5, "A") == 2
    assert table.opened(5, "B") == DIRECT  # A's handles are open
    table.released(5, "B", True)  # changes nothing
    assert table.open_count(5, "A") == 2
    table.released(5, "A", False)
    assert table.opened(5, "B") == DIRECT  # one A handle is still open
    table.released(5, "B", True)
    table.released(5, "A", False)
    assert table.open_count(5, "A") == 0
    assert table.opened(5, "A") == KEEP  # the record stays with 0: the pages are still A's
    table.released(5, "A", False)
    assert table.opened(5, "B") == FRESH  # all closed: another version, the record moves
    assert table.open_count(5, "B") == 1
    assert table.open_count(5, "A") == 0
    table.released(5, "B", False)
    assert table.opened(5, "B") == KEEP
    table.released(5, "B", False)
    assert table.opened(5, "A") == FRESH  # the kernel may hold B's pages now
    table.released(5, "A", False)
    assert table.opened(6, "A") == FRESH  # another inode has a record of its own
    stats = table.statistics()
    assert (stats.records, stats.evictions, stats.fallbacks) == (2, 0, 0)
    assert stats.slots == 1 << 20


def test_a_release_never_goes_below_zero_or_touches_another_version(table):
    table.released(7, "A", False)  # no record
    assert table.opened(7, "A") == FRESH
    table.released(7, "B", False)  # not the recorded version
    assert table.open_count(7, "A") == 1
    table.released(7, "A", False)
    table.released(7, "A", False)
    assert table.open_count(7, "A") == 0
    assert table.opened(7, "A") == KEEP
    assert table.open_count(7, "A") == 1


def test_an_inode_number_is_positive(table):
    with pytest.raises(ValueError):
        table.opened(0, "A")
    with pytest.raises(ValueError):
        SharedOpenVersions.create(table.path.parent, 0)


def test_the_file_is_sparse(tmp_path):
    versions = SharedOpenVersions.create(tmp_path)
    try:
        versions.opened(1, "A")
        info = os.stat(versions.path)
        assert info.st_size == 64 + (1 << 20) * SLOT_BYTES
        assert info.st_blocks * 512 < 1 << 20  # only touched pages are stored
    finally:
        versions.close()


# -- a full table ----------------------------------------------------------------------------


def test_eviction_and_a_full_window_in_a_small_table(tmp_path):
    table = SharedOpenVersions.create(tmp_path, 8, window=8)
    try:
        for inode in range(1, 8):  # seven inodes with a handle open
            assert table.opened(inode, "A") == FRESH
        assert table.opened(8, "A") == FRESH
        table.released(8, "A", False)  # the only slot with no open handle
        assert table.opened(9, "A") == FRESH  # takes inode 8's slot
        assert table.statistics().evictions == 1
        table.released(9, "A", False)
        # inode 8's record is gone: the kernel may hold pages of any version
        assert table.opened(8, "A") == FRESH
        assert table.statistics().evictions == 2  # inode 9's slot this time
        # every slot has open handles: nothing can be recorded, the handle bypasses the cache
        assert table.opened(10, "A") == DIRECT
        table.released(10, "A", True)
        assert table.opened(9, "A") == DIRECT
        table.released(9, "A", True)
        stats = table.statistics()
        assert (stats.records, stats.evictions, stats.fallbacks) == (8, 2, 2)
        for inode in range(1, 9):
            assert table.open_count(inode, "A") == 1
            table.released(inode, "A", False)
        for inode in range(1, 9):  # still recorded
            assert table.opened(inode, "A") == KEEP
    finally:
        table.close()


@pytest.mark.parametrize("seed", range(5))
def test_random_opens_in_a_small_table_never_mix_versions(tmp_path, seed):
    """Against a model of the kernel: keep_cache only when every page it may hold is of the
    handle's version, and never a handle through the page cache while one of another version
    through it is open."""
    table = SharedOpenVersions.create(tmp_path, 8, window=3)
    rng = random.Random(seed)
    #: per inode, the versions whose pages the kernel may hold (all of them until proven not)
    may_hold: dict[int, set[str] | None] = {}
    through_cache: dict[int, Counter[str]] = {}
    handles: list[tuple[int, str, bool]] = []
    try:
        for _ in range(5000):
            if handles and rng.random() < 0.5:
                inode, etag, direct_io = handles.pop(rng.randrange(len(handles)))
                table.released(inode, etag, direct_io)
                if not direct_io:
                    through_cache[inode][etag] -= 1
                continue
            inode, etag = rng.randint(1, 16), rng.choice("ABC")
            keep_cache, direct_io = table.opened(inode, etag)
            held = may_hold.get(inode)
            if keep_cache:
                assert not direct_io
                assert held == {etag}, (inode, etag, held)
            if not direct_io:
                open_others = +through_cache.setdefault(inode, Counter())
                open_others.pop(etag, None)
                assert not open_others, (inode, etag, open_others)
                through_cache[inode][etag] += 1
                # without keep_cache the kernel drops the inode's pages at this open
                may_hold[inode] = {etag} if not keep_cache else held
            handles.append((inode, etag, direct_io))
        for inode, etag, direct_io in handles:
            table.released(inode, etag, direct_io)
        for inode in range(1, 17):
            for etag in "ABC":
                assert table.open_count(inode, etag) == 0
        stats = table.statistics()
        assert stats.evictions > 0
        assert stats.records <= 8
    finally:
        table.close()


# -- several processes -----------------------------------------------------------------------


def _wait_readable(fd: int) -> bytes:
    ready, _, _ = select.select([fd], [], [], TIMEOUT_S)
    assert ready, "timed out waiting for a child"
    return os.read(fd, 1)


def test_a_version_open_in_a_child_sends_another_to_direct_io(table):
    to_parent_r, to_parent_w = os.pipe()
    to_child_r, to_child_w = os.pipe()

    def child() -> None:
        assert table.opened(3, "A") == FRESH
        os.write(to_parent_w, b"o")
        _wait_readable(to_child_r)
        table.released(3, "A", False)
        os.write(to_parent_w, b"r")

    pid = fork(child)
    try:
        assert _wait_readable(to_parent_r) == b"o"
        assert table.opened(3, "B") == DIRECT
        table.released(3, "B", True)
        assert table.opened(3, "A") == KEEP  # the child's pages are A's
        table.released(3, "A", False)
        os.write(to_child_w, b"c")
        assert _wait_readable(to_parent_r) == b"r"
        assert table.opened(3, "B") == FRESH  # nothing open: the record moves to B
        table.released(3, "B", False)
    finally:
        assert [wait(pid)] == [0]
        for fd in (to_parent_r, to_parent_w, to_child_r, to_child_w):
            os.close(fd)


def _run_children(works: list[Callable[[], None]]) -> None:
    """Start the children together (all wait on one pipe) and check they all succeed."""
    start_r, start_w = os.pipe()

    def wrapped(work: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            _wait_readable(start_r)
            work()

        return run

    pids = [fork(wrapped(work)) for work in works]
    try:
        os.write(start_w, b"g" * len(pids))
    finally:
        codes = [wait(pid) for pid in pids]
        os.close(start_r)
        os.close(start_w)
    assert codes == [0] * len(pids)


def test_no_update_is_lost_between_processes(table):
    pairs = 2000

    def pairs_of(etag: str) -> Callable[[], None]:
        def work() -> None:
            for _ in range(pairs):
                _, direct_io = table.opened(11, "A")  # both processes, one version
                table.released(11, "A", direct_io)
                _, direct_io = table.opened(12, etag)  # each process its own version
                table.released(12, etag, direct_io)

        return work

    _run_children([pairs_of("A"), pairs_of("B")])
    for inode in (11, 12):
        for etag in "AB":
            assert table.open_count(inode, etag) == 0

    def hold() -> None:
        for _ in range(pairs):
            assert table.opened(13, "A")[1] is False

    _run_children([hold, hold])
    assert table.open_count(13, "A") == 2 * pairs

    def drop() -> None:
        for _ in range(pairs):
            table.released(13, "A", False)

    _run_children([drop, drop])
    assert table.open_count(13, "A") == 0
    assert table.opened(13, "B") == FRESH


# -- the serial part -------------------------------------------------------------------------


def test_the_time_the_lock_is_held_is_counted(table, monkeypatch):
    """Every update adds its time under the lock to `lock_time` (the stats' serial part), and
    nothing else does: a clock that moves 5 ns per reading gives 5 ns per section."""
    readings = iter(range(0, 10_000, 5))
    monkeypatch.setattr(lock_time, "_clock", lambda: next(readings))
    before = lock_time.held_s()
    table.opened(5, "A")
    table.released(5, "A", False)
    table.open_count(5, "A")
    assert lock_time.held_s() - before == pytest.approx(3 * 5e-9)
