"""A mount's parts, built from the settings and wired together: caches, blocks, fs, hints.

`open_mount` yields everything the daemon serves through FUSE, and closes it all on exit. The
FUSE adapter itself, pyfuse3 and the process's lifetime stay in `blobmount.daemon`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from blobmount.blocks.disk_tier import BlockDiskTier, open_block_disk_tier
from blobmount.blocks.manager import BlockManager
from blobmount.blocks.shelf import HintedShelf
from blobmount.compose.configs import (
    block_manager_config,
    disk_tier_config,
    fs_config,
    hint_config,
    whole_file_config,
)
from blobmount.compose.storage import StorageStack
from blobmount.fs.filesystem import BlobFilesystem
from blobmount.fs.forward import MAIN_PROCESS
from blobmount.hints.coordinator import HintCoordinator
from blobmount.memory_limit import usable_memory_bytes
from blobmount.settings import Settings
from blobmount.source import SourceSpec
from blobmount.storage.base import StorageClient
from blobmount.units import format_size
from blobmount.wholefile.cache import WholeFileCache, open_whole_file_cache
from blobmount.wholefile.hints import WholeFileHints

if TYPE_CHECKING:  # only multi-process mounts build these
    from blobmount.multiproc.namespace import SharedNamespace

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Caches:
    """The disk cache of the open mode: blocks (`disk`), or whole files (`whole_files`)."""

    disk: BlockDiskTier | None
    whole_files: WholeFileCache | None


@dataclass(frozen=True, slots=True)
class MountParts:
    storage: StorageStack
    blocks: BlockManager
    fs: BlobFilesystem
    hints: HintCoordinator
    disk: BlockDiskTier | None
    whole_files: WholeFileCache | None
    #: the parts' background work (loads, read-ahead, hinted downloads); cancelled on exit
    work: trio.Nursery


@asynccontextmanager
async def open_caches(
    settings: Settings,
    storage: StorageClient,
    shared: SharedNamespace | None = None,
) -> AsyncIterator[Caches]:
    """The disk cache for the mode DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED picks, its background
    tasks running; either may be None when turned off or unusable (logged). `shared`: what the
    processes of a multi-process mount share (the cache's space figures, whole-file downloads)."""
    location = storage.location
    shared_budget = None if shared is None else shared.budget
    if settings.block_based_cache_enabled:
        disk_config = disk_tier_config(settings)
        async with open_block_disk_tier(disk_config, location, shared_budget=shared_budget) as disk:
            yield Caches(disk, None)
        return
    log.info("whole-file mode: the block disk cache is off (files that do not fit stream)")
    async with open_whole_file_cache(
        storage,
        whole_file_config(settings),
        location,
        shared_budget=shared_budget,
        siblings=None if shared is None else shared.copies,
    ) as files:
        yield Caches(None, files)


@asynccontextmanager
async def open_mount(
    settings: Settings,
    spec: SourceSpec,
    storage: StorageStack,
    shared: SharedNamespace | None = None,
) -> AsyncIterator[MountParts]:
    """The parts of a mount of `spec` over `storage`, wired to each other; on exit the
    background work is cancelled and the caches are closed. `shared`: the state every process
    of a multi-process mount resolves inodes and handles through (blobmount.multiproc)."""
    async with (
        open_caches(settings, storage.client, shared) as caches,
        trio.open_nursery() as work,
    ):
        config = block_manager_config(settings, usable_memory_bytes())
        if settings.read_ahead_memory_limit is None:
            log.info(
                "read-ahead memory limit (automatic): %s",
                format_size(config.read_ahead_budget_bytes),
            )
        blocks = BlockManager(storage.client, config, work, caches.disk)
        fs = BlobFilesystem(
            storage.client,
            blocks,
            fs_config(settings, spec, time.time()),
            caches.whole_files,
            shared,
        )
        prefetcher = (
            blocks if caches.whole_files is None else WholeFileHints(caches.whole_files, work)
        )
        hints = HintCoordinator(
            hint_config(settings),
            prefetcher,
            fs.version_of,
            spec.prefix,
            None if shared is None else shared.hinted,
        )
        blocks.hinted.on_free = hints.room_freed
        fs.open_listener = hints
        if shared is not None and caches.whole_files is None:
            # the main process's hinted blocks on the shelf, where the others read them
            shelf = HintedShelf.create(shared.folder)
            if shared.index == MAIN_PROCESS:
                blocks.hinted.shelve_on(shelf)
            else:
                blocks.hinted.read_shelf_of(shelf)
        if shared is not None:
            work.start_soon(fs.sweep_while_idle)
        try:
            yield MountParts(storage, blocks, fs, hints, caches.disk, caches.whole_files, work)
        finally:
            work.cancel_scope.cancel()
