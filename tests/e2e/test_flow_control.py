"""An outage through a real mount (issue #27, test 2): storage answers 503 to every request while
8 readers read, through the fault proxy in front of Azurite.

- every read during the outage ends with EIO within the read bound (tests/helpers/bounds.py,
  which counts the flow controller's wait for the account's Retry-After pause and for a slot);
- once the daemon's stats say the breaker is open, a new read fails with EIO at once, without a
  request (the issue says within 100 ms; asserted under 0.5 s, a margin for a loaded 2-core
  machine that a read still waiting out retries, about 1 s a try here, cannot meet), and the
  mount sends about one probe per probe interval instead of 8 readers' retries;
- once storage answers again, a read succeeds within 5 s (asserted within 10 s) and returns the
  right bytes; from then on a read of any file succeeds at once, and so does every file.

Counts come from the proxy and the daemon's stats; the times are the issue's behaviour bounds,
each with a margin.
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from blobmount.testing.pattern import pattern_bytes, pattern_sha256
from tests.helpers.bounds import SLACK_S, Limits, in_thread
from tests.helpers.daemon_calls import stats, wait_for
from tests.helpers.fault_proxy import ALL_KINDS, throttle
from tests.helpers.mount import MountedDaemon

pytestmark = [pytest.mark.fuse, pytest.mark.azurite]

KiB = 1024
#: few retries and short timeouts, so an outage fails a read in seconds; small blocks, so the
#: files are small and each read is one or two fetches
LIMITS = Limits(retries=2, connect_s=1.0, read_timeout_s=1.5, block_size=256 * KiB)
BLOCK = LIMITS.block_size
#: what storage says to every request during the outage
RETRY_AFTER_S = 1.0
BREAKER_S = 5.0
#: the daemon's probe interval while the breaker is open (storage/breaker.py)
PROBE_INTERVAL_S = 2.0
READERS = 8
READ = 64 * KiB
ENV = {
    **LIMITS.env(),
    # no RAM or disk tier and no read-ahead: every block a read touches is a request
    "DATASET_MOUNT_MEMORY_CACHE_SIZE": "0",
    "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED": "false",
    "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT": "0",
    "DATASET_MOUNT_READ_THREADS": str(READERS),
    "DATASET_MOUNT_BREAKER_SECONDS": str(BREAKER_S),
}
#: one file per reader, and one only the test's own reads touch
FILE_BYTES = 16 * BLOCK
READER_FILES = [f"r/f{i}.bin" for i in range(READERS)]
MINE = "own/x.bin"
FILES = [*READER_FILES, MINE]
#: the issue's bounds, and the margins a loaded machine gets
FAST_FAIL_S = 0.1
FAST_FAIL_MARGIN_S = 0.4
RECOVERY_S = 5.0
RECOVERY_MARGIN_S = 5.0


@pytest.fixture(scope="module")
def dataset(azurite) -> Iterator[str]:
    container = f"flow-{uuid.uuid4().hex[:8]}"
    azurite.create_container(container)
    azurite.upload_many(container, [(n, pattern_bytes(n, 0, FILE_BYTES)) for n in FILES])
    try:
        yield container
    finally:
        azurite.delete_container(container)


@pytest.fixture
def mounted(proxy, mount_factory, dataset) -> Iterator[MountedDaemon]:
    yield mount_factory(dataset, env=ENV, base_url=proxy.account_url)
    # before mount_factory's teardown: storage answers again, so nothing holds up the unmount
    proxy.clear()


def expected(name: str, offset: int, size: int) -> bytes:
    return pattern_bytes(name, offset, max(0, min(size, FILE_BYTES - offset)))


@dataclass(frozen=True, slots=True)
class Outcome:
    started: float
    seconds: float
    errno: int | None  # None: the read returned bytes


class Readers:
    """READERS threads, each reading fresh blocks of its own file (opened before the outage)
    until stopped, 50 ms apart."""

    def __init__(self, fds: list[int]) -> None:
        self.outcomes: list[list[Outcome]] = [[] for _ in fds]
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._read, args=(i, fd), name=f"reader-{i}", daemon=True)
            for i, fd in enumerate(fds)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _read(self, i: int, fd: int) -> None:
        n = 0
        while not self._stop.is_set():
            # blocks 1..15: block 0 was read before the outage and may be in the page cache
            offset = (1 + n % 15) * BLOCK
            n += 1
            started = time.monotonic()
            try:
                os.pread(fd, READ, offset)
                code = None
            except OSError as exc:
                code = exc.errno
            self.outcomes[i].append(Outcome(started, time.monotonic() - started, code))
            self._stop.wait(0.05)

    def stop(self, timeout_s: float) -> bool:
        """Stop and join them; False if one is still stuck in a read after `timeout_s`."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)


def test_an_outage_fails_reads_within_the_bound_then_at_once_and_the_mount_recovers(mounted, proxy):
    daemon = mounted
    read_bound_s = LIMITS.read_s(RETRY_AFTER_S)
    fds = [os.open(daemon.mountpoint / name, os.O_RDONLY) for name in FILES]
    readers: Readers | None = None
    try:
        # healthy first: every file opens and reads (the opens pin versions before the outage)
        for name, fd in zip(FILES, fds, strict=True):
            assert os.pread(fd, READ, 0) == expected(name, 0, READ)
        assert stats(daemon)["flow"]["breaker"] == "closed"

        proxy.set_fault(throttle(retry_after=f"{RETRY_AFTER_S:g}", kinds=ALL_KINDS))
        outage = time.monotonic()
        readers = Readers(fds[:READERS])
        readers.start()

        # nothing but failures, on 8 blobs, for BREAKER_S: the breaker opens
        assert wait_for(lambda: stats(daemon)["flow"]["breaker"] == "open", 60.0), stats(daemon)
        opened = stats(daemon)["flow"]
        print(f"breaker open {time.monotonic() - outage:.1f}s into the outage")

        # while it is open, a new read of a block no one has asked for fails at once, unsent;
        # a read that happens to be the breaker's probe goes to storage and is not timed
        fast: list[float] = []
        mine = fds[READERS]
        for k in range(10):
            if len(fast) >= 5:
                break
            started = time.monotonic()
            read = in_thread(os.pread, mine, READ, (1 + k) * BLOCK)
            with pytest.raises(OSError) as info:
                read.result(timeout=read_bound_s + SLACK_S)
            took = time.monotonic() - started
            assert info.value.errno == errno.EIO
            if not any(r.blob == MINE and r.at >= started for r in proxy.records()):
                fast.append(took)
        print("fast failures: " + ", ".join(f"{s * 1000:.0f} ms" for s in fast))
        assert len(fast) >= 3, "most reads should fail without a request while it is open"
        assert max(fast) < FAST_FAIL_S + FAST_FAIL_MARGIN_S

        # the readers keep reading: about one probe per interval goes out, not their retries
        time.sleep(3.0)
        still = stats(daemon)["flow"]
        open_for_s = still["breaker_open_s"] - opened["breaker_open_s"]
        sent = still["sent"] - opened["sent"]
        print(f"{sent} requests in {open_for_s:.1f}s open, {still['fast_failures']} fast failures")
        assert still["breaker"] in ("open", "half-open")
        assert still["breaker_opened"] >= 1
        assert still["fast_failures"] > opened["fast_failures"]
        assert sent <= open_for_s / PROBE_INTERVAL_S + 3

        assert readers.stop(read_bound_s + SLACK_S), "a read outlived the read bound"
        every = [o for mine_ in readers.outcomes for o in mine_]
        assert all(mine_ for mine_ in readers.outcomes), "every reader read during the outage"
        assert {o.errno for o in every} == {errno.EIO}
        slowest = max(o.seconds for o in every)
        print(
            f"{len(every)} reads failed, the slowest in {slowest:.1f}s (bound {read_bound_s:.0f}s)"
        )
        assert slowest < read_bound_s + SLACK_S

        # storage answers again: reads succeed within seconds (the next probe closes it)
        proxy.clear()
        recovered = time.monotonic()
        offset = 14 * BLOCK
        while True:
            read = in_thread(os.pread, mine, READ, offset)
            try:
                data = read.result(timeout=read_bound_s + SLACK_S)
                break
            except OSError as exc:
                failed = exc.errno
            assert failed == errno.EIO
            assert time.monotonic() - recovered < RECOVERY_S + RECOVERY_MARGIN_S, stats(daemon)
            time.sleep(0.05)
        took = time.monotonic() - recovered
        print(f"reads succeed {took:.1f}s after storage recovered")
        assert data == expected(MINE, offset, READ)
        assert took < RECOVERY_S + RECOVERY_MARGIN_S
        assert stats(daemon)["flow"]["breaker"] == "closed"
        # one answer closes the breaker for the whole mount: reads of every file right away,
        # whichever process serves them, succeed (a mount of several processes, each with a
        # breaker of its own, failed those that landed in another process for up to a probe
        # interval)
        offset = 13 * BLOCK
        reads = [in_thread(os.pread, fd, READ, offset) for fd in fds]
        for name, read in zip(FILES, reads, strict=True):
            assert read.result(timeout=read_bound_s + SLACK_S) == expected(name, offset, READ)
    finally:
        if readers is not None:
            proxy.clear()
            readers.stop(read_bound_s + SLACK_S)
        for fd in fds:
            os.close(fd)
    # every byte of every file, through fresh opens of the same mount
    for name in FILES:
        with open(daemon.mountpoint / name, "rb") as f:
            assert pattern_sha256(name, FILE_BYTES) == _sha256(f.read())
    assert daemon.proc is not None
    assert daemon.proc.poll() is None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
