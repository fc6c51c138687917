"""Hinted blocks on the shelf (blocks/shelf.py, blocks/hinted.py): what the main
process fetched for a hinted file, readable by the other processes of the mount, and removed by
the main process alone, within its byte count."""

import os

from blobmount.blocks.hinted import HintedBlocks
from blobmount.blocks.keys import BlockKey
from blobmount.blocks.shelf import HintedShelf

KEY = BlockKey("folder/a.jpg", '"0x8D0"', 0)


def stores(tmp_path, capacity=1 << 20, limit=1 << 20):
    """The main process's store on a shelf, and another process's store reading it."""
    shelf = HintedShelf.create(tmp_path)
    shelf.capacity = capacity
    main, other = HintedBlocks(limit), HintedBlocks(0)
    main.shelve_on(shelf)
    other.read_shelf_of(HintedShelf(shelf.folder, 0))
    return shelf, main, other


def put(store, key, data):
    assert store.reserve(len(data))
    store.put(key, data, len(data))


def test_another_process_reads_a_shelved_block_and_the_main_process_removes_it(tmp_path):
    shelf, main, other = stores(tmp_path)
    put(main, KEY, b"x" * 1000)
    assert shelf.holds(KEY)
    assert KEY in main
    assert main.statistics().held_bytes == 1000  # counted against the hint memory
    # the other process reads it only for a handle opened in place of the main process
    assert other.take(KEY, 1000) is None
    assert other.take(KEY, 1000, shelved=True) == b"x" * 1000
    assert other.take(KEY, 1000, shelved=True) == b"x" * 1000  # left for the main process
    assert other.statistics().shelf_reads == 2
    # the close reaches the main process: it takes the block off and frees its room
    assert main.drop_file(KEY.name, KEY.etag) == 1000
    assert not shelf.holds(KEY)
    assert os.listdir(shelf.folder) == []
    assert main.statistics().held_bytes == 0
    assert other.take(KEY, 1000, shelved=True) is None  # fetched as without hints


def test_blocks_another_process_read_leave_as_taken_not_dropped(tmp_path):
    shelf, main, other = stores(tmp_path)
    put(main, KEY, b"x" * 1000)
    assert other.take(KEY, 1000, shelved=True) == b"x" * 1000
    main.hand_over(KEY.name, KEY.etag)  # the other process closed it, having read it
    stats = main.statistics()
    assert (stats.taken, stats.dropped, stats.held_bytes) == (1, 0, 0)
    assert not shelf.holds(KEY)


def test_the_main_process_takes_its_own_shelved_block_off_the_shelf(tmp_path):
    shelf, main, _ = stores(tmp_path)
    put(main, KEY, b"y" * 500)
    assert main.take(KEY, 500) == b"y" * 500
    assert not shelf.holds(KEY)
    assert main.statistics().held_bytes == 0
    assert main.take(KEY, 500) is None
    put(main, KEY, b"z" * 500)
    main.discard(KEY)  # a reader fetched it itself meanwhile
    assert not shelf.holds(KEY)
    assert main.statistics().held_bytes == 0


def test_a_block_of_another_version_or_size_is_never_read(tmp_path):
    shelf, main, other = stores(tmp_path)
    put(main, KEY, b"x" * 1000)
    newer = BlockKey(KEY.name, '"0x8D1"', 0)
    assert other.take(newer, 1000, shelved=True) is None
    assert other.take(KEY, 999, shelved=True) is None  # not the length the version says


def test_a_block_still_being_written_is_a_miss(tmp_path):
    shelf, _, other = stores(tmp_path)
    with open(shelf.path(KEY), "wb") as f:  # what a reader may find while `put` writes
        f.write(b"x" * 600)
    assert other.take(KEY, 1000, shelved=True) is None
    with open(shelf.path(KEY), "ab") as f:
        f.write(b"x" * 400)
    assert other.take(KEY, 1000, shelved=True) == b"x" * 1000


def test_blocks_beyond_the_shelfs_capacity_stay_in_the_main_process(tmp_path):
    shelf, main, other = stores(tmp_path, capacity=1500)
    second = BlockKey(KEY.name, KEY.etag, 1)
    put(main, KEY, b"a" * 1000)
    put(main, second, b"b" * 1000)  # would pass the capacity: kept in memory
    assert shelf.holds(KEY)
    assert not shelf.holds(second)
    assert main.statistics().held_bytes == 2000
    # what an open asks before it is made where it landed: only a shelved block says yes
    assert main.on_shelf(KEY)
    assert other.on_shelf(KEY)
    assert not main.on_shelf(second)
    assert not other.on_shelf(second)
    assert other.take(second, 1000, shelved=True) is None
    assert main.take(second, 1000) == b"b" * 1000
    # room on the shelf again once a shelved block left
    assert main.take(KEY, 1000) == b"a" * 1000
    put(main, second, b"c" * 1000)
    assert shelf.holds(second)


def test_a_shelf_that_cannot_be_written_keeps_the_block_in_memory(tmp_path):
    shelf, main, _ = stores(tmp_path)
    os.rmdir(shelf.folder)  # every write fails
    put(main, KEY, b"x" * 100)
    assert main.take(KEY, 100) == b"x" * 100


def test_the_shelf_takes_at_most_half_the_free_space(tmp_path):
    # other tests write and remove files meanwhile: the shelf saw free space between the two
    before = os.statvfs(tmp_path)
    shelf = HintedShelf.create(tmp_path)
    after = os.statvfs(tmp_path)
    most = max(s.f_bavail * s.f_frsize // 2 + s.f_frsize for s in (before, after))
    assert 0 < shelf.capacity <= most
