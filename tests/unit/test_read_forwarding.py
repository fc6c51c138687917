"""READs passed to the process that opened the handle (fs/forward.py), over real Unix sockets
in one trio run: answers matched to their requests in any order, errors passed on, and a
forwarder that finds no opener says so instead of hanging."""

import errno
import os
import random

import pytest
import trio
import trio.testing

from blobmount.errors import BlobNotFound
from blobmount.fs.errno_map import FsError
from blobmount.fs.forward import (
    MAX_NOTICE,
    NOTE_CLOSED,
    NOTE_OPENED,
    ForwardFailed,
    ReadForwarder,
    ReadServer,
)


def payload(fh, offset, size):
    return bytes((fh + offset + i) % 251 for i in range(size))


async def slow_read(fh, offset, size):
    """A read that takes a random while, so answers overtake each other."""
    await trio.sleep(random.random() / 100)
    if fh == 13:
        raise FsError(errno.EBADF)
    if fh == 14:
        raise RuntimeError("a bug in the opener")
    if fh == 15:
        raise BlobNotFound("deleted")
    return payload(fh, offset, size)


def held_at(gate):
    """A read of handle 1 that waits for `gate` (an answer that comes late); others at once."""

    async def read(fh, offset, size):
        if fh == 1:
            await gate.wait()
        return payload(fh, offset, size)

    return read


async def test_reads_come_back_whole_and_matched_to_their_requests(nursery, tmp_path):
    server = ReadServer(tmp_path, 0, slow_read)
    await nursery.start(server.run)
    woken = []
    forwarder = ReadForwarder(tmp_path, 1, nursery, woken.append)
    results = {}

    async def one(fh, offset, size):
        results[fh, offset, size] = bytes(await forwarder.read(0, fh, offset, size))

    sizes = [0, 1, 4096, 131072, 1 << 20, (1 << 20) + 1] * 8
    asks = [(100 + i, i * 7, size) for i, size in enumerate(sizes)]
    async with trio.open_nursery() as readers:
        for ask in asks:
            readers.start_soon(one, *ask)
    assert all(results[ask] == payload(*ask) for ask in asks)
    assert (server.served, forwarder.forwarded, forwarder.failed) == (48, 48, 0)
    # 48 at once, 8 slots: the others' bytes (and those bigger than a slot) came in the socket
    assert 0 < forwarder.in_area <= 40
    # after each request, the opener (here: this process, by the pid it said hello with) is
    # woken from a blocked read of /dev/fuse
    assert woken == [os.getpid()] * 48
    forwarder.close()


async def test_the_openers_errors_are_the_reads_errors(nursery, tmp_path):
    await nursery.start(ReadServer(tmp_path, 0, slow_read).run)
    forwarder = ReadForwarder(tmp_path, 1, nursery)
    with pytest.raises(FsError) as info:
        await forwarder.read(0, 13, 0, 10)
    assert info.value.errno == errno.EBADF
    with pytest.raises(FsError) as info:
        await forwarder.read(0, 14, 0, 10)
    assert info.value.errno == errno.EIO
    with pytest.raises(FsError) as info:
        await forwarder.read(0, 15, 0, 10)
    assert info.value.errno == errno.ENOENT  # as FUSE would have answered in the opener
    assert bytes(await forwarder.read(0, 3, 0, 10)) == payload(3, 0, 10)  # still connected
    forwarder.close()


async def test_no_opener_to_ask_is_a_failed_forward(nursery, tmp_path):
    forwarder = ReadForwarder(tmp_path, 1, nursery)
    with pytest.raises(ForwardFailed):
        await forwarder.read(0, 1, 0, 10)
    assert forwarder.failed == 1


async def test_an_opener_that_goes_away_fails_the_reads_waiting_for_it(nursery, tmp_path):
    started = trio.Event()

    async def never(fh, offset, size):
        started.set()
        await trio.sleep_forever()

    with trio.CancelScope() as server_scope:
        async with trio.open_nursery() as server_nursery:
            await server_nursery.start(ReadServer(tmp_path, 0, never).run)
            forwarder = ReadForwarder(tmp_path, 1, nursery)
            outcome = []

            async def waiting():
                with pytest.raises(ForwardFailed):
                    await forwarder.read(0, 1, 0, 10)
                outcome.append("failed")

            nursery.start_soon(waiting)
            await started.wait()
            server_scope.cancel()  # the opener dies: its socket closes
    with trio.fail_after(5):
        while not outcome:
            await trio.sleep(0.01)
    # a successor takes the same index (and socket name): later reads reach it
    await nursery.start(ReadServer(tmp_path, 0, slow_read).run)
    assert bytes(await forwarder.read(0, 2, 5, 100)) == payload(2, 5, 100)
    forwarder.close()


async def test_an_interrupted_read_leaves_the_connection_usable(nursery, tmp_path):
    gate = trio.Event()
    await nursery.start(ReadServer(tmp_path, 0, held_at(gate)).run)
    forwarder = ReadForwarder(tmp_path, 1, nursery)
    with trio.move_on_after(0.05):  # the kernel's INTERRUPT of a READ
        await forwarder.read(0, 1, 0, 10)
    gate.set()  # its answer arrives after all, and is dropped
    await trio.testing.wait_all_tasks_blocked()
    assert bytes(await forwarder.read(0, 2, 0, 10)) == payload(2, 0, 10)
    forwarder.close()


async def test_notices_arrive_in_order_between_reads_and_need_no_answer(nursery, tmp_path):
    heard = []
    server = ReadServer(
        tmp_path, 0, slow_read, notice=lambda kind, text: heard.append((kind, text))
    )
    await nursery.start(server.run)
    forwarder = ReadForwarder(tmp_path, 1, nursery)
    # posted from synchronous code, several at once: sent together by one task
    for i in range(50):
        forwarder.post(
            0, NOTE_OPENED if i % 2 == 0 else NOTE_CLOSED, f"folder/{i}\0etag{i}".encode()
        )
    assert bytes(await forwarder.read(0, 3, 0, 10)) == payload(3, 0, 10)
    with trio.fail_after(5):
        while len(heard) < 50:
            await trio.sleep(0.01)
    assert heard == [
        (NOTE_OPENED if i % 2 == 0 else NOTE_CLOSED, f"folder/{i}\0etag{i}".encode())
        for i in range(50)
    ]
    assert (forwarder.notices, forwarder.notices_lost, server.served) == (50, 0, 1)
    forwarder.close()


async def test_a_notice_nobody_can_take_is_counted_lost(nursery, tmp_path):
    forwarder = ReadForwarder(tmp_path, 1, nursery)
    forwarder.post(0, NOTE_OPENED, b"a\0b")
    forwarder.post(0, NOTE_CLOSED, b"a\0b")
    with trio.fail_after(5):
        while forwarder.notices_lost < 2:
            await trio.sleep(0.01)
    assert forwarder.notices == 0


async def test_a_failing_notice_or_an_oversized_one_never_breaks_the_reads(nursery, tmp_path):
    def broken(kind, text):
        raise RuntimeError("a bug in the coordinator")

    await nursery.start(ReadServer(tmp_path, 0, slow_read, notice=broken).run)
    forwarder = ReadForwarder(tmp_path, 1, nursery)
    forwarder.post(0, NOTE_OPENED, b"a\0b")
    assert bytes(await forwarder.read(0, 4, 0, 10)) == payload(4, 0, 10)
    # a broken peer's oversized notice: its connection is dropped, the next read reconnects
    forwarder.post(0, NOTE_OPENED, b"x" * (MAX_NOTICE + 1))
    with trio.fail_after(5):
        while True:
            try:
                assert bytes(await forwarder.read(0, 5, 0, 10)) == payload(5, 0, 10)
                break
            except ForwardFailed:
                await trio.sleep(0.01)
    forwarder.close()


async def test_answers_in_the_area_one_after_another_reuse_its_first_slot(nursery, tmp_path):
    await nursery.start(ReadServer(tmp_path, 0, slow_read).run)
    forwarder = ReadForwarder(tmp_path, 1, nursery)
    for i in range(20):
        view = await forwarder.read(0, 7, i * 4096, 4096)
        assert bytes(view) == payload(7, i * 4096, 4096)
    assert forwarder.in_area == 20
    forwarder.close()


async def test_without_an_area_every_answer_comes_through_the_socket(nursery, tmp_path):
    await nursery.start(ReadServer(tmp_path, 0, slow_read).run)
    forwarder = ReadForwarder(tmp_path, 1, nursery, area_slots=0)
    for size in (10, 1 << 20):
        assert bytes(await forwarder.read(0, 8, 3, size)) == payload(8, 3, size)
    assert (forwarder.forwarded, forwarder.in_area) == (2, 0)
    forwarder.close()


async def test_an_interrupted_reads_slot_is_free_only_once_its_late_answer_came(nursery, tmp_path):
    """The opener may still write the slot of a READ the kernel interrupted: until its answer
    has come, no other READ may have its bytes written there."""
    gate = trio.Event()
    await nursery.start(ReadServer(tmp_path, 0, held_at(gate)).run)
    forwarder = ReadForwarder(tmp_path, 1, nursery, area_slots=1)
    with trio.move_on_after(0.05):
        await forwarder.read(0, 1, 0, 1000)
    # the only slot is still the interrupted READ's: this one's bytes come in the socket
    assert bytes(await forwarder.read(0, 2, 0, 1000)) == payload(2, 0, 1000)
    assert forwarder.in_area == 0
    gate.set()  # the late answer is written in the slot, and frees it
    await trio.testing.wait_all_tasks_blocked()
    assert bytes(await forwarder.read(0, 3, 0, 1000)) == payload(3, 0, 1000)
    assert forwarder.in_area == 1
    forwarder.close()
