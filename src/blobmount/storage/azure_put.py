"""Put Blob: the one write blobmount ever makes, used only to store a dataset snapshot.

Mounts are read-only, and the lean REST client signs reads only (an account key becomes a
read+list SAS there), so this write goes through the Azure SDK's async `BlobClient`, on an
asyncio bridge of its own, with the credential `resolve_access` chose for the snapshot's URI.
It is never part of a mount's storage stack.

Azure replaces a blob atomically: readers see the old blob or the new one, never a mix. Up to
`SINGLE_PUT_LIMIT` the file is sent as one Put Blob; above it, as blocks that one Put Block
List commits at the end, which is atomic in the same way (uncommitted blocks are invisible).
"""

from __future__ import annotations

import inspect
import logging

import trio
from azure.storage.blob import ContentSettings
from azure.storage.blob.aio import BlobClient

from blobmount.storage._aio_bridge import AsyncioBridge
from blobmount.storage.azure import MIN_BODY_BYTES_PER_S, translate_error
from blobmount.storage.azure_auth import AzureAccess
from blobmount.storage.overload import TimedOut

log = logging.getLogger(__name__)

#: sent as one Put Blob up to this size (Azure takes up to 5000 MiB in one)
SINGLE_PUT_LIMIT = 256 * 1024 * 1024
#: the block size above it
BLOCK_SIZE = 64 * 1024 * 1024


async def put_blob(
    access: AzureAccess,
    name: str,
    data: bytes,
    *,
    connect_timeout_s: float = 10.0,
    read_timeout_s: float = 30.0,
    user_agent: str = "blobmount",
) -> str:
    """Create or replace blob `name` in `access`'s container with `data`; its new ETag.

    Raises:
        CredentialError, ContainerNotFound, StorageUnavailable, StorageError.
    """
    where = f"{access.account}/{access.container}/{name}"

    async def upload() -> str:  # on the bridge's asyncio loop
        client = BlobClient(
            access.account_url,
            access.container,
            name,
            credential=access.credential,  # type: ignore[arg-type]
            max_single_put_size=SINGLE_PUT_LIMIT,
            max_block_size=BLOCK_SIZE,
            connection_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            user_agent=user_agent,
        )
        try:
            async with client:
                result = await client.upload_blob(
                    data,
                    overwrite=True,
                    content_settings=ContentSettings(content_type="application/octet-stream"),
                )
                return str(result["etag"])
        finally:
            close = getattr(access.credential, "close", None)
            if close is not None and inspect.iscoroutinefunction(close):
                await close()

    deadline_s = connect_timeout_s + 2 * read_timeout_s + len(data) / MIN_BODY_BYTES_PER_S
    bridge = AsyncioBridge("blobmount-put").start()
    try:
        with trio.move_on_after(deadline_s):
            return await bridge.run(upload)
    except Exception as exc:  # SDK, aiohttp and asyncio errors alike: translated in one place
        raise translate_error(exc, "PUT", where) from None
    finally:
        bridge.close()
    raise TimedOut(f"PUT {where}: timed out (not stored in {deadline_s:.0f}s)")
