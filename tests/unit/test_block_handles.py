"""OpenHandles on its own: where other readers of a file began, as each handle's read-ahead sees
it, while the file is open; nothing kept once it is closed."""

from __future__ import annotations

from blobmount.blocks.handles import MAX_CLOSED_STARTS, BlockHandle, OpenHandles
from blobmount.blocks.keys import BlobVersion
from blobmount.blocks.readahead import ReadAheadPolicy

V = BlobVersion("data/file", "etag-1", 1000 * 1024)


def opened(handles: OpenHandles, version: BlobVersion = V) -> BlockHandle:
    handle = BlockHandle(version, ReadAheadPolicy(8, 1000))
    handles.add(handle)
    return handle


def test_a_first_read_in_the_middle_limits_the_others_but_not_the_reader():
    handles = OpenHandles()
    part, whole = opened(handles), opened(handles)
    part.policy.on_read(20, 20)
    assert handles.others_start_in(whole, range(15, 25)) == 20
    assert handles.others_start_in(whole, range(21, 30)) is None  # only starts inside count
    assert handles.others_start_in(part, range(15, 25)) is None


def test_the_first_start_in_the_window_is_the_limit():
    handles = OpenHandles()
    reader = opened(handles)
    for start in (40, 22, 31):
        opened(handles).policy.on_read(start, start)
    assert handles.others_start_in(reader, range(20, 50)) == 22


def test_another_version_of_the_blob_is_no_limit():
    handles = OpenHandles()
    opened(handles, BlobVersion(V.name, "etag-2", V.size)).policy.on_read(20, 20)
    assert handles.others_start_in(opened(handles), range(15, 25)) is None


def test_a_closed_readers_start_counts_only_while_the_file_stays_open():
    handles = OpenHandles()
    reader = opened(handles)
    gone = opened(handles)
    gone.policy.on_read(20, 20)
    gone.policy.on_read(21, 21)  # a stream under way from block 20
    handles.remove(gone)
    assert handles.others_start_in(reader, range(15, 25)) == 20
    handles.remove(reader)
    assert len(handles) == 0
    assert handles.others_start_in(opened(handles), range(15, 25)) is None


def test_a_random_readers_start_is_forgotten_when_it_closes():
    handles = OpenHandles()
    reader = opened(handles)
    random = opened(handles)
    random.policy.on_read(20, 20)  # never moved on
    assert handles.others_start_in(reader, range(15, 25)) == 20
    handles.remove(random)
    assert handles.others_start_in(reader, range(15, 25)) is None


def test_closed_starts_are_bounded_and_the_newest_are_kept():
    handles = OpenHandles()
    opened(handles)
    for start in range(0, 3 * MAX_CLOSED_STARTS, 3):
        handle = opened(handles)
        handle.policy.on_read(start, start)
        handle.policy.on_read(start + 1, start + 1)
        handles.remove(handle)
    readers = handles.of(V)
    assert readers is not None
    assert list(readers.closed_starts) == list(range(0, 3 * MAX_CLOSED_STARTS, 3))
    again = opened(handles)  # a start seen again is news again, not the oldest
    again.policy.on_read(0, 0)
    again.policy.on_read(1, 1)
    handles.remove(again)
    handle = opened(handles)
    handle.policy.on_read(500, 500)
    handle.policy.on_read(501, 501)
    handles.remove(handle)
    assert len(readers.closed_starts) == MAX_CLOSED_STARTS
    assert 3 not in readers.closed_starts  # the oldest went
    assert list(readers.closed_starts)[-2:] == [0, 500]
