"""Read-order hints through a real mount of Azurite: a shuffled read of 2,000 small files, hinted,
is served from blocks fetched ahead; wrong hints change no byte; the hint window stays bounded;
bad hint lines are counted and skipped. The mounts use the seed's one-pass small-file settings
(no RAM tier, no disk tier), so nothing but the hints can have fetched a block before its read.
"""

from __future__ import annotations

import random
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from blobmount.hints.client import HintChannel, hinted
from blobmount.runstate import hints_socket
from blobmount.testing.pattern import pattern_bytes
from tests.helpers.mount import daemon_stats as stats

pytestmark = [pytest.mark.fuse, pytest.mark.azurite]

FILES = 2000
ONE_PASS = {
    "DATASET_MOUNT_MEMORY_CACHE_SIZE": "0",
    "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED": "false",
}


def size_of(i: int) -> int:
    return 20_000 + (i * 7919) % 10_000


def name_of(i: int) -> str:
    return f"img/{i // 500:02d}/{i:05d}.jpg"


def wait_for(predicate, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def dataset(azurite):
    container = f"hints-{uuid.uuid4().hex[:8]}"
    azurite.create_container(container)
    azurite.put_many(
        container, [(name_of(i), pattern_bytes(name_of(i), 0, size_of(i))) for i in range(FILES)]
    )
    try:
        yield container
    finally:
        azurite.delete_container(container)


def read_check(path, i: int) -> None:
    with open(path, "rb") as f:
        assert f.read() == pattern_bytes(name_of(i), 0, size_of(i)), name_of(i)


def test_hinted_shuffled_reads_hit_blocks_fetched_ahead(dataset, mount_factory):
    daemon = mount_factory(dataset, env=ONE_PASS)
    order = list(range(FILES))
    random.Random(1).shuffle(order)
    mnt = daemon.mountpoint
    for i in hinted(order, window=256, path_of=lambda i: mnt / name_of(i)):
        read_check(mnt / name_of(i), i)
    s = stats(daemon)
    h, blocks = s["hints"], s["blocks"]
    assert h["received"] == FILES
    assert h["invalid"] == 0
    # nearly every file's GET was started by its hint before the reader opened it (the first
    # few race the hints); most had landed by then, the rest were joined in flight
    assert h["used"] >= 0.9 * FILES, h
    assert blocks["hinted_hits"] >= 0.5 * FILES, blocks
    assert blocks["hinted_hits"] + blocks["storage_waits"] == FILES, blocks
    # one GET per file, no more: hinted fetches are not repeated by the reads
    assert s["storage"]["range_requests"] <= FILES + 5
    # nothing is left held once every hinted file was read and closed
    assert wait_for(lambda: stats(daemon)["blocks"]["hinted"]["held_bytes"] == 0)


def test_wrong_hints_change_no_byte_and_cost_bounded_memory(dataset, mount_factory):
    limit = 2 * 1024 * 1024
    env = {**ONE_PASS, "DATASET_MOUNT_HINT_MEMORY_LIMIT": str(limit)}
    daemon = mount_factory(dataset, env=env)
    mnt = daemon.mountpoint
    read_order = list(range(0, FILES, 4))
    wrong_order = list(range(1, FILES, 4))  # files nobody reads
    random.Random(2).shuffle(read_order)
    held = []
    with HintChannel() as channel:
        channel.send([mnt / "no/such/file.jpg", mnt / "img"])  # missing, and a folder
        channel.send([mnt / name_of(i) for i in wrong_order])
        for n, i in enumerate(read_order):
            read_check(mnt / name_of(i), i)
            if n % 50 == 0:
                held.append(stats(daemon)["blocks"]["hinted"])
    s = stats(daemon)
    # every held sample stayed within the hint memory limit, in-flight reservations included
    assert all(h["held_bytes"] + h["reserved_bytes"] <= limit for h in held), held
    assert max(h["held_bytes"] for h in held) > 0  # the wrong hints were fetched...
    assert s["hints"]["used"] == 0  # ...and none was any use
    assert wait_for(lambda: stats(daemon)["hints"]["invalid"] == 2)


def test_the_hint_window_stays_bounded_when_nobody_reads(dataset, mount_factory):
    env = {
        **ONE_PASS,
        "DATASET_MOUNT_HINT_WINDOW": "16",
        "DATASET_MOUNT_HINT_MEMORY_LIMIT": "64MB",
    }
    daemon = mount_factory(dataset, env=env)
    mnt = daemon.mountpoint
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(hints_socket(mnt)))
    sock.setblocking(False)
    lines = b"".join(f"{name_of(i)}\n".encode() for i in range(FILES))
    sent = 0
    try:
        # the daemon stops reading once its queue is full: the socket buffer fills up
        deadline = time.monotonic() + 20
        while sent < len(lines) and time.monotonic() < deadline:
            try:
                sent += sock.send(lines[sent : sent + 65536])
            except BlockingIOError:
                time.sleep(0.05)
        assert wait_for(lambda: stats(daemon)["hints"]["ahead"] == 16)
        time.sleep(0.5)
        h = stats(daemon)["hints"]
        assert h["ahead"] == 16
        assert h["queued"] <= 4 * 16
        assert h["received"] < FILES  # the rest waits in the socket, not in the daemon
        # reading the hinted files in order lets the window move on (each read either found its
        # file fetched ahead, or overtook its hint)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda i: read_check(mnt / name_of(i), i), range(200)))
        after = stats(daemon)["hints"]
        assert after["used"] >= 16, after
        assert after["used"] + after["late"] >= 200, after
        assert after["received"] > h["received"], after
    finally:
        sock.close()


def test_paths_outside_the_mount_are_ignored_by_the_helper(dataset, mount_factory, tmp_path):
    daemon = mount_factory(dataset, env=ONE_PASS)
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("x")
    items = [outside, daemon.mountpoint / name_of(3)]
    assert [p.name for p in hinted(items, window=8)] == ["elsewhere.txt", name_of(3).split("/")[-1]]
    assert wait_for(lambda: stats(daemon)["hints"]["received"] == 1)


def test_a_client_may_send_its_whole_order_and_go(dataset, mount_factory):
    daemon = mount_factory(dataset, env=ONE_PASS)
    mnt = daemon.mountpoint
    order = list(range(300))
    random.Random(3).shuffle(order)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(hints_socket(mnt)))
        sock.sendall(b"".join(f"{mnt}/{name_of(i)}\n".encode() for i in order))
    assert wait_for(lambda: stats(daemon)["hints"]["received"] == 300)
    for i in order:
        read_check(mnt / name_of(i), i)
    h = stats(daemon)["hints"]
    assert h["used"] >= 0.9 * 300, h
    assert h["invalid"] == 0
