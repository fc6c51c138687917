"""Settings → the frozen config of each part of a mount: pure functions, one per component.

Every value a mount's parts get from the settings is derived here, once (the block size, the
read-ahead budget, the cache space, the FUSE options). A second process given the same
`Settings` (and memory reading) builds the same configs. The storage client's config is in
`compose.storage`, the downloader's in `compose.download`.
"""

from __future__ import annotations

import logging
import os

from blobmount.blocks.disk_tier import DiskTierConfig
from blobmount.blocks.manager import BlockManagerConfig
from blobmount.cachedir.space import SpaceConfig
from blobmount.fs.filesystem import FsConfig
from blobmount.hints.coordinator import HintConfig
from blobmount.settings import Settings
from blobmount.source import SourceSpec
from blobmount.storage.flow import FlowConfig
from blobmount.wholefile.cache import WholeFileConfig

log = logging.getLogger(__name__)

#: the automatic read-ahead cap: this share of the memory the daemon may use, between room for
#: two and for eight full read-ahead windows
AUTO_READ_AHEAD_MEMORY_SHARE = 16
AUTO_READ_AHEAD_WINDOWS = (2, 8)


def block_size(settings: Settings) -> int:
    """The block size every part agrees on: blocks, the disk tier, the filesystem's st_blksize."""
    return settings.read_block_size


def read_ahead_budget(settings: Settings, memory_bytes: int | None = None) -> int:
    """Bytes all open files together may hold in read-ahead: DATASET_MOUNT_READ_AHEAD_MEMORY_LIMIT,
    or automatically 1/16 of `memory_bytes` (the RAM or cgroup limit the daemon runs under),
    kept between two and eight full read-ahead windows.

    Eight readers of a large file, each its own part, read 1.6x faster with room for eight
    windows than for two (docs/CONFIGURATION.md); a sidecar with little memory keeps the two."""
    if settings.read_ahead_memory_limit is not None:
        return settings.read_ahead_memory_limit
    size = block_size(settings)
    window = max(1, settings.read_buffer_block_count) * size
    low, high = (n * window for n in AUTO_READ_AHEAD_WINDOWS)
    low = max(low, 4 * size)
    share = 0 if memory_bytes is None else memory_bytes // AUTO_READ_AHEAD_MEMORY_SHARE
    return max(low, min(high, share))


def block_manager_config(settings: Settings, memory_bytes: int | None) -> BlockManagerConfig:
    """`memory_bytes`: what the daemon may use (`memory_limit.usable_memory_bytes`)."""
    return BlockManagerConfig(
        block_size=block_size(settings),
        read_ahead_blocks=settings.read_buffer_block_count,
        prefetch_slots=settings.read_threads,
        ram_bytes=settings.memory_cache_size,
        read_ahead_budget_bytes=read_ahead_budget(settings, memory_bytes),
        hint_bytes=settings.hint_memory_limit,
        hint_slots=settings.hint_threads,
    )


def fs_config(settings: Settings, spec: SourceSpec, mount_time: float) -> FsConfig:
    """`mount_time`: epoch seconds, the mtime of folders that have no marker blob."""
    ttl = settings.attribute_cache_ttl_ms
    return FsConfig(
        blob_prefix=spec.prefix,
        ttl_s=None if ttl is None else ttl / 1000.0,
        uid=os.getuid() if settings.uid is None else settings.uid,
        gid=os.getgid() if settings.gid is None else settings.gid,
        file_mode=settings.file_mode,
        dir_mode=settings.dir_mode,
        mount_time=mount_time,
        block_size=block_size(settings),
        listing_mode=settings.listing_mode,
    )


def space_config(settings: Settings) -> SpaceConfig:
    """The cache directory's space rules, shared by the block and the whole-file cache."""
    return SpaceConfig(
        cache_size=settings.cache_size,
        reserved_free_bytes=settings.reserved_free_disk_space,
        prune_threshold=settings.file_cache_prune_threshold,
        prune_target=settings.file_cache_prune_target,
    )


def disk_tier_config(settings: Settings) -> DiskTierConfig:
    return DiskTierConfig(
        enabled=settings.block_file_cache_enabled,
        root=settings.cache_dir,
        block_size=block_size(settings),
        space=space_config(settings),
        max_queue_bytes=settings.block_file_cache_max_queue_size,
        write_threads=settings.block_file_cache_write_threads,
        read_threads=settings.read_threads,
        drain_timeout_s=float(settings.unmount_timeout_s),
    )


def whole_file_config(settings: Settings) -> WholeFileConfig:
    return WholeFileConfig(
        root=settings.cache_dir,
        space=space_config(settings),
        download_slots=settings.read_threads,
    )


def hint_config(settings: Settings) -> HintConfig:
    return HintConfig(window=settings.hint_window_files)


def flow_config(settings: Settings) -> FlowConfig:
    """The account's flow controller: at most as many requests in flight as the largest pool
    that sends them (read-ahead and whole-file downloads, hinted fetches, `download`), so it
    holds nothing back until storage pushes back; the breaker opens after
    DATASET_MOUNT_BREAKER_SECONDS of nothing but failures."""
    return FlowConfig(
        enabled=settings.flow_control,
        max_in_flight=max(
            settings.read_threads, settings.hint_threads, settings.downloader_threads
        ),
        breaker_open_after_s=settings.breaker_seconds,
        # a queue behind stalled requests: each waits at most one read timeout for a slot
        max_queue_wait_s=settings.read_timeout_s,
    )


def fuse_options(settings: Settings, spec: SourceSpec) -> set[str]:
    """The mount options given to pyfuse3.init (a read-only mount named after the source)."""
    fsname = "".join(c if c.isalnum() or c in ":/._-" else "_" for c in spec.display)
    options = {f"fsname={fsname}", "subtype=blobmount", "ro", "default_permissions", "noatime"}
    if settings.allow_other:
        options.add("allow_other")
    return options
