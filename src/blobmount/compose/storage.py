"""The storage stack of a mount or a download: the client, then retries, then counting.

`open_storage` is the only place the wrappers are stacked, so a mount and a download (and a
second process given the same settings) see the storage the same way. The Azure client comes
from `open_azure_storage`; tests and benchmarks pass their own `StorageFactory` instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import trio

from blobmount._version import __version__
from blobmount.errors import StorageError
from blobmount.settings import Settings, describe
from blobmount.source import SourceSpec
from blobmount.storage.base import StorageClient
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.retry import RetryingStorageClient

log = logging.getLogger(__name__)

#: opens the storage client at the bottom of the stack (tests and benchmarks pass their own)
StorageFactory = Callable[[], AbstractAsyncContextManager[StorageClient]]

#: what the Azure client names itself in its User-Agent header
USER_AGENT = f"blobmount/{__version__}"


@dataclass(frozen=True, slots=True)
class AzureClientConfig:
    """How the Azure client connects (the credentials come from the environment)."""

    connect_timeout_s: float
    read_timeout_s: float
    max_connections: int
    user_agent: str
    anonymous: bool


@dataclass(frozen=True, slots=True)
class StorageStack:
    """The wrapped client, and each layer kept for its statistics."""

    client: StorageClient  # the top of the stack: what components are given
    counting: CountingStorageClient
    retrying: RetryingStorageClient


def azure_client_config(settings: Settings) -> AzureClientConfig:
    return AzureClientConfig(
        connect_timeout_s=settings.connect_timeout_s,
        read_timeout_s=settings.read_timeout_s,
        # enough for the prefetch pool, the demand reads beside it, and `download`
        max_connections=max(64, settings.read_threads * 2, settings.downloader_threads),
        user_agent=USER_AGENT,
        anonymous=settings.anonymous,
    )


@asynccontextmanager
async def open_azure_storage(settings: Settings, spec: SourceSpec) -> AsyncIterator[StorageClient]:
    """The Azure client for `spec`, with its asyncio bridge; closed on exit."""
    # lazy: the Azure SDK and aiohttp load only when a real Azure client is opened
    from blobmount.storage._aio_bridge import AsyncioBridge
    from blobmount.storage.azure import AzureStorageClient
    from blobmount.storage.azure_auth import resolve_access

    config = azure_client_config(settings)
    access = resolve_access(spec, os.environ, anonymous=config.anonymous)
    log.info("storage %s, credentials: %s", spec.display, access.method)
    log.info("settings: %s", "; ".join(f"{name}={value}" for name, value, _ in describe(settings)))
    bridge = AsyncioBridge()
    bridge.start()
    try:
        # the client takes over access.credential: its aclose() closes a token credential too
        client = AzureStorageClient(
            access.account_url,
            access.container,
            access.credential,
            bridge=bridge,
            account=access.account,
            connect_timeout_s=config.connect_timeout_s,
            read_timeout_s=config.read_timeout_s,
            max_connections=config.max_connections,
            user_agent=config.user_agent,
        )
        try:
            yield client
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()
    finally:
        bridge.close()


@asynccontextmanager
async def open_storage(
    settings: Settings, spec: SourceSpec, factory: StorageFactory | None = None
) -> AsyncIterator[StorageStack]:
    """The stack over `factory`'s client (default: the Azure client for `spec`): retries
    (AZUREML_DATASET_HTTP_RETRY_COUNT), then request counting on top."""
    opener = factory or (lambda: open_azure_storage(settings, spec))
    async with opener() as client:
        retrying = RetryingStorageClient(client, retries=settings.http_retry_count)
        counting = CountingStorageClient(retrying)
        yield StorageStack(counting, counting, retrying)


async def check_source(storage: StorageClient, spec: SourceSpec) -> None:
    """Fail before mounting if the container is missing, the credentials are refused or the
    endpoint does not answer (raises the matching StorageError, saying which source)."""
    try:
        await storage.list_page(spec.prefix, delimiter="/", max_results=1)
    except StorageError as exc:
        raise type(exc)(f"cannot mount {spec.display}: {exc}") from None
