"""How long a FUSE read may take when storage misbehaves, computed from the settings.

This is the formula docs/RELIABILITY.md states; tests assert reads finish within it (plus slack
for a loaded machine) rather than timing anything tighter. The names mirror the settings:

    call_s(n)   = connect + 2 * read_timeout + n / MIN_BODY_BYTES_PER_S   one storage call
    queue_s     = min(Retry-After, 60) + read_timeout        the flow controller's hold on a try
    fetch_s     = (retries + 1) * (call_s(block) + queue_s) + Σ backoff   one block, all tries
    read_s      = 2 (kernel re-read after a failed read-ahead) * 2 (blocks one FUSE read of up
                  to 128 KiB can touch) * fetch_s

`queue_s` is the term the flow controller (storage/flow.py, issue #27) adds to every try, which
docs/RELIABILITY.md names in words but its `fetch` formula leaves out: before a try is sent it
waits out the account's Retry-After pause (which another request may have started, so even a
first try can wait it) and then for a slot, at most the read timeout before it goes anyway.

Also: `in_thread` runs a blocking call on a daemon thread, so a read stuck on a hung mount fails
the test (result(timeout) raises) instead of hanging pytest, and teardown can still unstick it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from blobmount.storage.azure import MIN_BODY_BYTES_PER_S

T = TypeVar("T")

MiB = 1024 * 1024
#: RetryingStorageClient's defaults (daemon.py does not change them)
BASE_DELAY_S = 0.1
MAX_DELAY_S = 8.0
MAX_RETRY_AFTER_S = 60.0
#: a buffered read that fails is tried once more by the kernel (a single-page read)
KERNEL_TRIES = 2
#: a FUSE read is at most 128 KiB, so it touches at most two blocks
BLOCKS_PER_READ = 2
#: for scheduling, process start-up, the proxy's own thread on a loaded 2-core machine
SLACK_S = 15.0


@dataclass(frozen=True, slots=True)
class Limits:
    retries: int
    connect_s: float
    read_timeout_s: float
    block_size: int = 2 * MiB

    def env(self) -> dict[str, str]:
        return {
            "AZUREML_DATASET_HTTP_RETRY_COUNT": str(self.retries),
            "DATASET_MOUNT_CONNECT_TIMEOUT_SECONDS": str(self.connect_s),
            "DATASET_MOUNT_READ_TIMEOUT_SECONDS": str(self.read_timeout_s),
            "DATASET_MOUNT_READ_BLOCK_SIZE": str(self.block_size),
        }

    def call_s(self, body_bytes: int) -> float:
        return self.connect_s + 2 * self.read_timeout_s + body_bytes / MIN_BODY_BYTES_PER_S

    def backoff_s(self, retry_after_s: float = 0.0) -> float:
        honoured = min(retry_after_s, MAX_RETRY_AFTER_S)
        return sum(
            max(min(MAX_DELAY_S, BASE_DELAY_S * 2**n), honoured) for n in range(self.retries)
        )

    def queue_s(self, retry_after_s: float = 0.0) -> float:
        """The most the flow controller holds one try before sending it: the account's pause
        (a Retry-After, capped as the retry layer caps it) and then a slot, whose wait is
        bounded by the read timeout (FlowConfig.max_queue_wait_s, set in compose/configs.py).
        A retry waits the pause inside its backoff already; counting it once more per try
        covers a pause pushed back by requests that were in flight when it began."""
        return min(retry_after_s, MAX_RETRY_AFTER_S) + self.read_timeout_s

    def fetch_s(self, retry_after_s: float = 0.0) -> float:
        per_try = self.call_s(self.block_size) + self.queue_s(retry_after_s)
        return (self.retries + 1) * per_try + self.backoff_s(retry_after_s)

    def read_s(self, retry_after_s: float = 0.0) -> float:
        return KERNEL_TRIES * BLOCKS_PER_READ * self.fetch_s(retry_after_s)


def in_thread(fn: Callable[..., T], *args: Any) -> Future[T]:
    """Start fn(*args) on a daemon thread; the future carries its result or exception."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:
            future.set_exception(exc)

    name = f"test-{getattr(fn, '__name__', 'call')}"
    threading.Thread(target=run, name=name, daemon=True).start()
    return future
