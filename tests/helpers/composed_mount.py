"""A mount's parts composed in this process over an in-memory store, without FUSE, and the
`LiveMount` the daemon would build over them: for tests of stats and metrics."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from blobmount.compose.mount import MountParts, open_mount
from blobmount.compose.storage import StorageStack, open_storage
from blobmount.process_figures import ProcessFigures
from blobmount.settings import Settings
from blobmount.snapshot import LiveMount
from blobmount.source import SourceSpec
from blobmount.storage.memory import InMemoryStorageClient

#: the process figures `live_mount` reports (fixed: CPU time changes from call to call)
PROCESS = ProcessFigures(
    pid=os.getpid(),
    main=True,
    requests=7,
    passed_on=0,
    answered_for_others=0,
    bytes_served=300,
    cpu_s=1.5,
    shared_lock_s=0.25,
)


@asynccontextmanager
async def composed_mount(
    settings: Settings, spec: SourceSpec, mem: InMemoryStorageClient
) -> AsyncIterator[tuple[StorageStack, MountParts]]:
    """The storage stack over `mem` and the mount's parts over it, as `daemon` composes them."""
    async with (
        open_storage(settings, spec, lambda: _opened(mem)) as stack,
        open_mount(settings, spec, stack) as parts,
    ):
        yield stack, parts


@asynccontextmanager
async def _opened(mem: InMemoryStorageClient) -> AsyncIterator[InMemoryStorageClient]:
    # `mem` as a storage factory opens it (open_storage's `factory`)
    yield mem


def live_mount(
    spec: SourceSpec, stack: StorageStack, parts: MountParts, *, throughput: float
) -> LiveMount:
    """What the daemon serves stats from, over these parts, mounted at /mnt/data since 0."""
    return LiveMount(
        source=spec.display,
        mountpoint="/mnt/data",
        pid=os.getpid(),
        started=0.0,
        throughput=lambda: throughput,
        fs=parts.fs,
        storage=stack.counting,
        retry=stack.retrying,
        blocks=parts.blocks,
        disk=parts.disk,
        hints=parts.hints,
        whole_file=parts.whole_files,
        flow=stack.flow,
        process=lambda: PROCESS,
    )
