"""What every user of a cache directory does around its work: prepare the folder of its kind
and location, hold the shared lock (so `blobmount cache clear` waits), and run its background
tasks (pruner, writers) in a nursery that ends with it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from blobmount.cachedir.layout import CacheLayout, DirLock, free_bytes

log = logging.getLogger(__name__)

#: how long starting waits for `blobmount cache clear` to let go of the directory
LOCK_WAIT_S = 10.0


@dataclass(frozen=True, slots=True)
class CacheDir:
    layout: CacheLayout
    #: the file system's allocation unit (what a file really occupies is rounded up to it)
    alloc_unit: int


def _prepare(layout: CacheLayout, kind: str, location: str, lock: DirLock) -> int:
    layout.prepare(kind, location)
    if not lock.acquire(shared=True, wait_s=LOCK_WAIT_S):
        log.warning("cache %s is locked by `blobmount cache clear`; using it anyway", layout.root)
    return free_bytes(layout.root)[1]


@asynccontextmanager
async def using_cache_dir(root: Path, kind: str, location: str) -> AsyncIterator[CacheDir | None]:
    """The cache directory prepared for `kind` entries of `location`, its shared lock held until
    exit; None if it cannot be used (the caller says what it does instead)."""
    layout = CacheLayout(root)
    lock = DirLock(layout.lock_path)
    try:
        alloc_unit = await trio.to_thread.run_sync(_prepare, layout, kind, location, lock)
    except OSError as exc:
        log.warning("cache %s cannot be used: %s", root, exc)
        yield None
        return
    try:
        yield CacheDir(layout, alloc_unit)
    finally:
        lock.release()


@asynccontextmanager
async def background_tasks() -> AsyncIterator[trio.Nursery]:
    """A nursery for a component's background tasks, cancelled when the body ends. An error of
    the body comes out as itself, not wrapped in an exception group."""
    body_error: Exception | None = None
    async with trio.open_nursery() as nursery:
        try:
            yield nursery
        except Exception as exc:
            body_error = exc  # re-raised below, outside the nursery
        finally:
            nursery.cancel_scope.cancel()
    if body_error is not None:
        raise body_error
