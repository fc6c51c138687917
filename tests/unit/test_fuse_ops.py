"""The pyfuse3 adapter's request wrapper: errors become FUSEError with the mapped errno, the
active-request count always comes back down, and `wait_idle` waits for it."""

from __future__ import annotations

import errno
import logging

import pyfuse3
import pytest
import trio
import trio.testing

from blobmount.errors import BlobNotFound, StorageUnavailable
from blobmount.fs.errno_map import FsError
from blobmount.fs.fuse_ops import FuseOperations


class _Fs:
    """Just enough of BlobFilesystem: `read` does what the test says."""

    kernel_timeout_s = 1.0

    def __init__(self) -> None:
        self.outcome: BaseException | bytes = b"data"
        self.gate: trio.Event | None = None

    async def read(self, fh: int, off: int, size: int) -> bytes:
        if self.gate is not None:
            await self.gate.wait()
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def _ops() -> tuple[FuseOperations, _Fs]:
    fs = _Fs()
    return FuseOperations(fs), fs  # type: ignore[arg-type]


async def test_a_read_returns_the_filesystems_bytes() -> None:
    ops, _ = _ops()
    assert await ops.read(1, 0, 4) == b"data"
    assert ops.active_requests == 0


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (FsError(errno.EBADF), errno.EBADF),
        (BlobNotFound("gone"), errno.ENOENT),
        (StorageUnavailable("throttled"), errno.EIO),
        (OSError(errno.ENOSPC, "full"), errno.EIO),
        (RuntimeError("a bug"), errno.EIO),
        (pyfuse3.FUSEError(errno.EROFS), errno.EROFS),
    ],
)
async def test_errors_become_fuse_errors(raised: Exception, expected: int) -> None:
    ops, fs = _ops()
    fs.outcome = raised
    with pytest.raises(pyfuse3.FUSEError) as caught:
        await ops.read(1, 0, 4)
    assert caught.value.errno == expected
    assert ops.active_requests == 0


async def test_an_unexpected_error_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ops, fs = _ops()
    fs.outcome = RuntimeError("a bug")
    with caplog.at_level(logging.ERROR), pytest.raises(pyfuse3.FUSEError):
        await ops.read(1, 0, 4)
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage() == "read failed"
    assert record.exc_info is not None
    assert record.exc_info[0] is RuntimeError


async def test_cancellation_is_not_turned_into_an_errno() -> None:
    ops, fs = _ops()
    fs.gate = trio.Event()
    with trio.move_on_after(0.01) as scope:
        await ops.read(1, 0, 4)
    assert scope.cancelled_caught
    assert ops.active_requests == 0


async def test_wait_idle_waits_for_requests_in_progress() -> None:
    ops, fs = _ops()
    await ops.wait_idle()  # nothing in progress: returns at once
    fs.gate = trio.Event()
    done: list[str] = []

    async def read() -> None:
        await ops.read(1, 0, 4)
        done.append("read")

    async def wait() -> None:
        await ops.wait_idle()
        done.append("idle")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert ops.active_requests == 2
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        assert done == []
        fs.gate.set()
    assert done == ["read", "read", "idle"]
    await ops.wait_idle()
