"""Storage faults through a real mount: a fault-injecting proxy sits between the daemon and Azurite.

For every fault the proxy can inject (throttling with Retry-After, 5xx, resets and short bodies,
stalls before the first byte and mid-body, a body that trickles), a read through the mount either
returns the right bytes or fails with the right errno, within the bound that follows from the
settings (tests/helpers/bounds.py, docs/RELIABILITY.md); other files stay readable meanwhile; and
once the fault stops, the same mount reads the same bytes again. Counts come from the proxy and
the daemon's stats, never from timings.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from azure.storage.blob import BlobClient

from blobmount.runstate import stats_socket
from blobmount.stats import fetch_stats
from blobmount.testing.pattern import pattern_bytes, pattern_sha256
from tests.helpers.bounds import SLACK_S, Limits, MiB, in_thread
from tests.helpers.fault_proxy import (
    ALL_KINDS,
    Fault,
    cut_short,
    reset_mid_body,
    server_error,
    stall,
    stall_mid_body,
    throttle,
    trickle,
    truncate,
)
from tests.helpers.mount import MountedDaemon

pytestmark = [pytest.mark.fuse, pytest.mark.azurite]

#: short timeouts and few retries, so a persistent fault fails in seconds, not minutes; the
#: read timeout still leaves Azurite ~100 times the time a healthy 2 MiB GET takes here
LIMITS = Limits(retries=2, connect_s=1.0, read_timeout_s=1.5)
#: no RAM or disk tier: a read after a fault must go to storage again, not to a cache
BASE_ENV = {
    **LIMITS.env(),
    "DATASET_MOUNT_MEMORY_CACHE_SIZE": "0",
    "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED": "false",
}
#: no read-ahead either: each block a reader touches is exactly one fetch, so counts are exact
NO_READ_AHEAD = {**BASE_ENV, "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT": "0"}

FILES = {
    "data/a.bin": 8 * MiB + 12345,
    "data/b.bin": 6 * MiB + 1,
    "data/small.txt": 100,
    "other/c.txt": 3000,
    **{f"many/f{i:02d}.bin": 300_000 + i for i in range(24)},
}


@pytest.fixture(scope="module")
def dataset(azurite) -> Iterator[str]:
    container = f"faults-{uuid.uuid4().hex[:8]}"
    azurite.create_container(container)
    azurite.upload_many(container, [(n, pattern_bytes(n, 0, s)) for n, s in FILES.items()])
    try:
        yield container
    finally:
        azurite.delete_container(container)


@pytest.fixture
def proxied_mount(proxy, mount_factory, dataset) -> Iterator[Callable[..., MountedDaemon]]:
    """mount(env) -> a daemon that reaches Azurite through `proxy`."""

    def mount(env: dict[str, str] | None = None) -> MountedDaemon:
        return mount_factory(dataset, env={**BASE_ENV, **(env or {})}, base_url=proxy.account_url)

    yield mount
    # before mount_factory's teardown: a read held by a stall must not hold up the unmount
    proxy.clear()


def stats(daemon: MountedDaemon) -> dict:
    return fetch_stats(stats_socket(daemon.mountpoint))


def sha256_of(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1024 * 1024):
            h.update(chunk)
    return h.hexdigest()


def expected(name: str, offset: int = 0, size: int | None = None) -> bytes:
    total = FILES[name]
    size = total - offset if size is None else size
    return pattern_bytes(name, offset, max(0, min(size, total - offset)))


def wait_for(predicate: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def pread(path, size: int, offset: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


# -- the proxy itself -------------------------------------------------------------------------


def test_proxy_is_transparent_and_every_range_get_is_pinned(proxied_mount, proxy, azurite, dataset):
    daemon = proxied_mount()
    blob = BlobClient.from_connection_string(azurite.connection_string, dataset, "data/a.bin")
    with blob:
        etag = blob.get_blob_properties().etag
    assert sha256_of(daemon.mountpoint / "data/a.bin") == pattern_sha256(
        "data/a.bin", FILES["data/a.bin"]
    )
    ranges = proxy.records("range")
    assert ranges, "the mount did not go through the proxy"
    assert {r.outcome for r in ranges} == {"forwarded"}
    # every ranged GET carries If-Match with the version seen at open (docs/SEMANTICS.md)
    assert {r.if_match for r in ranges} == {etag}
    assert all(r.range for r in ranges)
    assert proxy.counts("range")["requests"] == stats(daemon)["storage"]["range_requests"]


# -- transient faults: retried, the read succeeds ---------------------------------------------

TRANSIENT: dict[str, Fault] = {
    "503 with Retry-After": throttle(retry_after="0"),
    "500": server_error(500),
    "502": server_error(502, "BadGateway"),
    "504": server_error(504, "GatewayTimeout"),
    "408": server_error(408, "RequestTimeout"),
    "429": server_error(429, "TooManyRequests"),
    "stall before the first byte": stall(None),
    "reset mid-body": reset_mid_body(),
    "closed mid-body": cut_short(),
    "body shorter than its range": truncate(),
}


@pytest.mark.parametrize("name", list(TRANSIENT))
def test_transient_fault_is_retried_and_the_read_returns_the_right_bytes(
    proxied_mount, proxy, name
):
    daemon = proxied_mount(NO_READ_AHEAD)
    path = daemon.mountpoint / "data/a.bin"
    fd = os.open(path, os.O_RDONLY)
    try:
        before = stats(daemon)
        # two failures, then the proxy passes requests again: within the 2 retries allowed
        proxy.set_fault(dataclasses.replace(TRANSIENT[name], limit=2))
        read = in_thread(os.pread, fd, 1 * MiB, 3 * MiB)
        data = read.result(timeout=LIMITS.read_s() + SLACK_S)
        assert data == expected("data/a.bin", 3 * MiB, MiB)
    finally:
        os.close(fd)
    after = stats(daemon)
    assert proxy.counts("range")[TRANSIENT[name].action] == 2
    assert after["retry"]["gave_up"] == before["retry"]["gave_up"]
    # one request per try, whatever the fault: only the retry layer re-requests
    assert after["retry"]["retries"] - before["retry"]["retries"] == 2


def test_listing_and_properties_requests_are_retried_too(proxied_mount, proxy):
    daemon = proxied_mount()
    before = stats(daemon)["retry"]["retries"]
    proxy.set_fault(throttle(retry_after="0", kinds=frozenset({"list"}), limit=2))
    assert sorted(os.listdir(daemon.mountpoint / "data")) == ["a.bin", "b.bin", "small.txt"]
    assert proxy.counts("list")["status"] == 2
    proxy.set_fault(throttle(retry_after="0", kinds=frozenset({"list", "properties"}), limit=2))
    assert os.stat(daemon.mountpoint / "other/c.txt").st_size == FILES["other/c.txt"]
    faulted = proxy.counts("list").get("status", 0) + proxy.counts("properties").get("status", 0)
    assert faulted == 4
    after = stats(daemon)
    assert after["retry"]["retries"] - before == 4
    assert after["retry"]["gave_up"] == 0


def test_retry_after_is_honoured(proxied_mount, proxy):
    daemon = proxied_mount(NO_READ_AHEAD)
    proxy.set_fault(throttle(retry_after="2", limit=1))
    assert pread(daemon.mountpoint / "data/b.bin", 4096, 0) == expected("data/b.bin", 0, 4096)
    first, *later = proxy.records("range")
    assert first.outcome == "status"
    again = next(r for r in later if r.range == first.range)
    # a lower bound, so a slow machine cannot fail it: the retry waited for the server's 2 s
    assert again.at - first.at >= 2.0 - 0.05


def test_a_share_of_failing_requests_of_every_kind_does_not_change_what_is_read(
    proxied_mount, proxy
):
    # the default retry count (7): a request fails 8 times in a row with probability 0.2**8
    daemon = proxied_mount({"AZUREML_DATASET_HTTP_RETRY_COUNT": "7"})
    proxy.set_fault(throttle(retry_after="0", kinds=ALL_KINDS, fraction=0.2))
    seen = {}
    for root, _dirs, files in os.walk(daemon.mountpoint):
        for name in files:
            path = os.path.join(root, name)
            seen[os.path.relpath(path, daemon.mountpoint)] = sha256_of(path)
    proxy.clear()
    assert seen == {name: pattern_sha256(name, size) for name, size in FILES.items()}
    faulted = proxy.counts().get("status", 0)
    assert faulted > 0
    # each failed request is retried once more (a read-ahead fetch may still be finishing)
    assert wait_for(lambda: stats(daemon)["retry"] == {"retries": faulted, "gave_up": 0})


# -- persistent faults: EIO within the bound, the rest of the mount unaffected, recovery ------

PERSISTENT: dict[str, tuple[Fault, float]] = {
    # fault, Retry-After it sends (for the bound)
    "503 with Retry-After": (throttle(retry_after="1"), 1.0),
    "500": (server_error(500), 0.0),
    "reset mid-body": (reset_mid_body(), 0.0),
    "closed mid-body": (cut_short(), 0.0),
    "body shorter than its range": (truncate(), 0.0),
    "stall before the first byte": (stall(None), 0.0),
    "stall mid-body": (stall_mid_body(None), 0.0),
    "body trickles in": (trickle(bytes_per_step=1024, interval_s=0.25), 0.0),
}


@pytest.mark.parametrize("name", list(PERSISTENT))
def test_persistent_fault_gives_eio_within_the_bound_and_the_mount_recovers(
    proxied_mount, proxy, name
):
    fault, retry_after_s = PERSISTENT[name]
    daemon = proxied_mount()
    a, b = daemon.mountpoint / "data/a.bin", daemon.mountpoint / "data/b.bin"
    fd = os.open(a, os.O_RDONLY)
    try:
        before = stats(daemon)
        proxy.set_fault(dataclasses.replace(fault, blob="data/a.bin"))
        bound_s = LIMITS.read_s(retry_after_s)
        started = time.monotonic()
        read = in_thread(os.pread, fd, 64 * 1024, 5 * MiB)
        with pytest.raises(OSError) as info:
            read.result(timeout=bound_s + SLACK_S)
        assert info.value.errno == errno.EIO
        print(f"{name}: EIO after {time.monotonic() - started:.1f}s, bound {bound_s:.1f}s")
        after = stats(daemon)
        assert after["retry"]["gave_up"] > before["retry"]["gave_up"]
        # everything else is still served while a.bin fails
        assert sha256_of(b) == pattern_sha256("data/b.bin", FILES["data/b.bin"])
        assert os.listdir(daemon.mountpoint / "other") == ["c.txt"]

        proxy.clear()
        # same mount, same open handle: the bytes that failed now arrive
        assert os.pread(fd, 64 * 1024, 5 * MiB) == expected("data/a.bin", 5 * MiB, 64 * 1024)
    finally:
        os.close(fd)
    assert sha256_of(a) == pattern_sha256("data/a.bin", FILES["data/a.bin"])
    assert daemon.proc is not None
    assert daemon.proc.poll() is None


# -- permanent errors: not retried -------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "errno_value"),
    [
        (403, "AuthorizationPermissionMismatch", errno.EACCES),
        (404, "BlobNotFound", errno.ENOENT),
    ],
)
def test_permanent_errors_are_not_retried(proxied_mount, proxy, status, code, errno_value):
    daemon = proxied_mount(NO_READ_AHEAD)
    path = daemon.mountpoint / "data/a.bin"
    fd = os.open(path, os.O_RDONLY)
    try:
        before = stats(daemon)
        proxy.set_fault(server_error(status, code))
        read = in_thread(os.pread, fd, 4096, 0)
        with pytest.raises(OSError) as info:
            read.result(timeout=LIMITS.read_s() + SLACK_S)
        assert info.value.errno == errno_value
        after = stats(daemon)
        assert after["retry"]["retries"] == before["retry"]["retries"]
        # one HTTP request per fetch: the kernel may ask twice, the mount never retries
        fetches = after["storage"]["range_requests"] - before["storage"]["range_requests"]
        assert proxy.counts("range")["status"] == fetches
        proxy.clear()
        assert os.pread(fd, 4096, 0) == expected("data/a.bin", 0, 4096)
    finally:
        os.close(fd)
