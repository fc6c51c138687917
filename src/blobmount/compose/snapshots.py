"""Dataset snapshots at the composition layer: made from one listing of a source, kept where a
snapshot reference says (a local path, or a blob in any source form), and loaded for a mount,
a download or a warm-up, whose storage stack `open_storage` tops with the client serving it.

Reading a snapshot blob goes through the same storage stack as a mount (retries, flow
control), pinned to the ETag it had when the read began, so a snapshot replaced while it is
read is read again whole rather than mixed. Writing one is a single atomic Put Blob
(`blobmount.storage.azure_put`); a local file is renamed into place (`snapshots.files`).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import trio

from blobmount.compose.storage import USER_AGENT, StorageFactory, open_storage
from blobmount.datastores import resolve_source
from blobmount.errors import BlobChanged, BlobNotFound, StorageError
from blobmount.settings import Settings
from blobmount.snapshots.client import SnapshotStorageClient
from blobmount.snapshots.diff import SnapshotDiff, diff
from blobmount.snapshots.files import is_blob_ref, local_path, read_local, write_local
from blobmount.snapshots.format import (
    Snapshot,
    SnapshotError,
    SnapshotHeader,
    decode,
    encode,
    read_header,
)
from blobmount.snapshots.table import SnapshotTable, TableBuilder
from blobmount.source import SourceSpec, redact_uri
from blobmount.storage.base import StorageClient
from blobmount.units import format_size

log = logging.getLogger(__name__)

#: a snapshot blob is read in ranges of this size, all pinned to one ETag
READ_CHUNK = 32 * 1024 * 1024
#: a snapshot blob replaced while being read is read again, this many times in all
READ_ATTEMPTS = 3
#: a line in the log every this many list pages while a snapshot is made
PAGES_PER_LOG_LINE = 100


@dataclass(frozen=True, slots=True)
class CreatedSnapshot:
    """What `create_snapshot` wrote."""

    where: str  # the snapshot's reference, secrets masked
    header: SnapshotHeader
    file_bytes: int
    list_requests: int  # what listing the source cost


def display_ref(ref: str) -> str:
    """A snapshot reference for messages: a URI with any SAS masked, or the path."""
    return redact_uri(ref.strip())


def plain_settings(settings: Settings) -> Settings:
    """`settings` without a snapshot: making or reading one must see the source itself."""
    return settings.model_copy(update={"snapshot": None})


def _blob_of(ref: str) -> tuple[SourceSpec, str]:
    """The container and blob name a snapshot URI names."""
    spec = resolve_source(ref)
    name = spec.prefix.rstrip("/")
    if not name:
        raise SnapshotError(
            f"the snapshot URI {display_ref(ref)} names a container, not a blob; add the "
            "snapshot's name after it (e.g. .../snapshots/train-2026-01.bmsnap)"
        )
    return spec, name


# -- making one --------------------------------------------------------------------------------


async def list_table(storage: StorageClient, prefix: str) -> SnapshotTable:
    """Every blob under `prefix`, from one flat listing (no delimiter: 5,000 names a page,
    whatever the folders)."""
    builder = TableBuilder()
    token: str | None = None
    pages = 0
    while True:
        page = await storage.list_page(prefix, delimiter=None, continuation=token)
        pages += 1
        for props in page.blobs:
            builder.add(props)
        if pages % PAGES_PER_LOG_LINE == 0:
            log.info("listed %d blobs (%d pages)", len(builder), pages)
        token = page.continuation
        if token is None:
            break
    try:
        return builder.build()
    except ValueError as exc:
        raise StorageError(f"listing {prefix or 'the container'}: {exc}") from None


async def create_snapshot(
    settings: Settings,
    spec: SourceSpec,
    ref: str,
    *,
    storage_factory: StorageFactory | None = None,
) -> CreatedSnapshot:
    """Record every blob under `spec` and write the snapshot to `ref` (a path or a blob URI).

    Raises:
        StorageError: the source cannot be listed, or the snapshot blob not written.
        SnapshotError: the snapshot cannot be written there.
    """
    async with open_storage(plain_settings(settings), spec, storage_factory) as stack:
        started = time.monotonic()
        try:
            table = await list_table(stack.client, spec.prefix)
        except StorageError as exc:
            # lazy: the diagnosis is needed only on this failure path
            from blobmount.compose.diagnosis import endpoint_of, explain

            reason = explain(exc, endpoint_of(spec.account_url))
            raise type(exc)(f"cannot list {spec.display}: {reason}") from None
        lists = stack.counting.statistics().list_requests
        location = stack.client.location
    log.info(
        "listed %d blobs (%s) of %s in %d requests, %.1fs",
        len(table),
        format_size(table.total_bytes),
        spec.display,
        lists,
        time.monotonic() - started,
    )
    data = encode(
        table, source=spec.display, location=location, prefix=spec.prefix, created=time.time()
    )
    await write_snapshot(settings, ref, data)
    header = read_header(data, display_ref(ref))
    return CreatedSnapshot(display_ref(ref), header, len(data), lists)


async def write_snapshot(settings: Settings, ref: str, data: bytes) -> None:
    """Store a snapshot file at `ref`, atomically: a reader never sees half of it."""
    if not is_blob_ref(ref):
        await trio.to_thread.run_sync(write_local, local_path(ref), data)
        return
    spec, name = _blob_of(ref)
    if spec.scheme == "synthetic":
        raise SnapshotError("a synthetic:// source holds no files: write the snapshot elsewhere")
    # lazy: the Azure SDK's blob client loads only when a snapshot is written to a blob
    from blobmount.storage.azure_auth import resolve_access
    from blobmount.storage.azure_put import put_blob

    access = resolve_access(spec, os.environ, anonymous=settings.anonymous)
    etag = await put_blob(
        access,
        name,
        data,
        connect_timeout_s=settings.connect_timeout_s,
        read_timeout_s=settings.read_timeout_s,
        user_agent=USER_AGENT,
    )
    log.info("wrote snapshot %s (%s, ETag %s)", display_ref(ref), format_size(len(data)), etag)


# -- reading one -------------------------------------------------------------------------------


async def read_snapshot_bytes(settings: Settings, ref: str) -> bytes:
    """The bytes of the snapshot file at `ref`, all of one version of it.

    Raises:
        SnapshotError: a local file that cannot be read.
        BlobNotFound: no snapshot blob there. StorageError: it cannot be read.
    """
    if not is_blob_ref(ref):
        return await trio.to_thread.run_sync(read_local, local_path(ref))
    spec, name = _blob_of(ref)
    async with open_storage(plain_settings(settings), spec) as stack:
        storage = stack.client
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                props = await storage.get_properties(name)
                parts = []
                for start in range(0, props.size, READ_CHUNK):
                    length = min(READ_CHUNK, props.size - start)
                    parts.append(await storage.get_range(name, props.etag, start, length))
                return b"".join(parts)
            except BlobNotFound:
                raise BlobNotFound(f"no snapshot at {display_ref(ref)}") from None
            except BlobChanged:
                if attempt == READ_ATTEMPTS:
                    raise
                log.info("snapshot %s was replaced while read; reading it again", name)
    raise AssertionError("unreachable")


async def load_snapshot(settings: Settings, ref: str) -> Snapshot:
    """The snapshot at `ref`, checked and decoded.

    Raises:
        SnapshotError: not a snapshot, another version, truncated or corrupt.
        StorageError: a snapshot blob that cannot be read.
    """
    started = time.monotonic()
    data = await read_snapshot_bytes(settings, ref)
    snapshot = decode(data, display_ref(ref))
    header, table = snapshot.header, snapshot.table
    log.info(
        "snapshot %s: %d blobs (%s) of %s, made %s; loaded in %.2fs, %s in memory",
        display_ref(ref),
        header.entries,
        format_size(header.total_bytes),
        header.source,
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(header.created)),
        time.monotonic() - started,
        format_size(table.nbytes),
    )
    return snapshot


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """What `blobmount snapshot show` prints."""

    where: str
    header: SnapshotHeader
    file_bytes: int


async def snapshot_info(settings: Settings, ref: str) -> SnapshotInfo:
    """The header of the snapshot at `ref`, its frame and checksum checked.

    Raises:
        SnapshotError, StorageError: as `load_snapshot`.
    """
    data = await read_snapshot_bytes(settings, ref)
    return SnapshotInfo(display_ref(ref), read_header(data, display_ref(ref)), len(data))


async def diff_snapshots(settings: Settings, old: str, new: str) -> SnapshotDiff:
    a = (await load_snapshot(settings, old)).table
    b = (await load_snapshot(settings, new)).table
    return diff(a, b)


# -- serving one -------------------------------------------------------------------------------


async def snapshot_client(
    snapshot: Snapshot, inner: StorageClient, spec: SourceSpec, ref: str
) -> SnapshotStorageClient:
    """The client that serves `spec`'s namespace from `snapshot` over `inner`, once the snapshot
    is known to be of this source and storage answers (one properties request, no listing).

    Raises:
        SnapshotError: the snapshot is of another container, or of a prefix that does not
            hold `spec`'s.
        CredentialError, ContainerNotFound, StorageUnavailable: storage does not answer.
    """
    header = snapshot.header
    where = display_ref(ref)
    if header.location != inner.location:
        raise SnapshotError(
            f"snapshot {where} is of {header.source} (container {header.location}), not of "
            f"{spec.display} (container {inner.location})"
        )
    if not spec.prefix.startswith(header.prefix):
        raise SnapshotError(
            f"snapshot {where} records only {header.prefix or 'the container'}; "
            f"{spec.display} is outside it"
        )
    client = SnapshotStorageClient(inner, snapshot.table, header)
    try:
        await client.check_reachable(spec.prefix)
    except StorageError as exc:
        # lazy: the diagnosis is needed only on this failure path
        from blobmount.compose.diagnosis import endpoint_of, explain

        reason = explain(exc, endpoint_of(spec.account_url))
        raise type(exc)(f"cannot mount {spec.display}: {reason}") from None
    log.info(
        "namespace of %s from snapshot %s: no list requests; reads pinned to its ETags",
        spec.display,
        where,
    )
    return client
