"""The storage stack of a mount or a download: the client, then the account's flow control, then
retries, then counting.

`open_storage` is the only place the wrappers are stacked, so a mount and a download (and a
second process given the same settings) see the storage the same way. The Azure client comes
from `open_azure_storage`, a synthetic:// source's made-up container from
`open_synthetic_storage`; tests and benchmarks may pass their own `StorageFactory` instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import trio

from blobmount._version import __version__
from blobmount.compose.configs import flow_config
from blobmount.compose.diagnosis import endpoint_of, explain
from blobmount.errors import StorageError
from blobmount.settings import Settings, describe
from blobmount.source import SourceSpec
from blobmount.storage.base import StorageClient
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.flow import account_flow
from blobmount.storage.flow_client import FlowControlledStorageClient
from blobmount.storage.retry import RetryingStorageClient
from blobmount.storage.shared_flow import SharedFlow
from blobmount.storage.synthetic import SyntheticDataset, SyntheticStorageClient

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
    flow: FlowControlledStorageClient


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
    """The Azure client for `spec`; closed on exit. It runs on trio; only an Azure AD
    credential starts an asyncio thread (for its tokens), when the first token is needed."""
    # lazy: the Azure SDK loads only when a real Azure client is opened
    from blobmount.storage.azure import AzureStorageClient
    from blobmount.storage.azure_auth import resolve_access

    config = azure_client_config(settings)
    access = resolve_access(spec, os.environ, anonymous=config.anonymous)
    log.info("storage %s, credentials: %s", spec.display, access.method)
    log.info("settings: %s", "; ".join(f"{name}={value}" for name, value, _ in describe(settings)))
    # the client takes over access.credential: its aclose() closes a token credential too
    client = AzureStorageClient(
        access.account_url,
        access.container,
        access.credential,
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


def open_source_storage(
    settings: Settings, spec: SourceSpec
) -> AbstractAsyncContextManager[StorageClient]:
    """The client at the bottom of the stack for `spec`: the Azure client, or for synthetic://
    (a test and benchmark tool) the made-up container its URI describes."""
    if spec.scheme == "synthetic":
        return open_synthetic_storage(settings, spec)
    return open_azure_storage(settings, spec)


@asynccontextmanager
async def open_synthetic_storage(
    settings: Settings, spec: SourceSpec
) -> AsyncIterator[StorageClient]:
    """The `SyntheticStorageClient` a synthetic:// URI describes: no network, no credentials."""
    dataset = SyntheticDataset.from_query(spec.synthetic_query or "")
    log.info("storage %s (synthetic: made-up data for tests and benchmarks)", spec.display)
    log.info("settings: %s", "; ".join(f"{name}={value}" for name, value, _ in describe(settings)))
    yield SyntheticStorageClient(dataset, spec.container)


@asynccontextmanager
async def open_storage(
    settings: Settings,
    spec: SourceSpec,
    factory: StorageFactory | None = None,
    *,
    shared_flow: SharedFlow | None = None,
) -> AsyncIterator[StorageStack]:
    """The stack over `factory`'s client (default: `open_source_storage`'s for `spec`): the flow
    control of its account (shared with every other stack on that account in this
    process; its breaker and pause with the other processes of the mount through
    `shared_flow`), retries (AZUREML_DATASET_HTTP_RETRY_COUNT) that wait for the account's
    Retry-After too, then request counting on top.

    With DATASET_MOUNT_SNAPSHOT, the snapshot is loaded first (a damaged one stops here, before
    any storage is opened) and a `SnapshotStorageClient` tops the stack: the namespace comes
    from the snapshot, reads go down the stack pinned to its ETags."""
    # lazy: compose.snapshots opens storage stacks of its own through this module (a cycle)
    from blobmount.compose.snapshots import load_snapshot, snapshot_client

    snapshot = (
        None if settings.snapshot is None else await load_snapshot(settings, settings.snapshot)
    )
    opener = factory or (lambda: open_source_storage(settings, spec))
    async with opener() as client:
        account = client.location.split("/", 1)[0]
        flow = FlowControlledStorageClient(
            client, account_flow(account, flow_config(settings), shared_flow)
        )
        retrying = RetryingStorageClient(flow, retries=settings.http_retry_count, pacer=flow.flow)
        counting = CountingStorageClient(retrying)
        top: StorageClient = counting
        if snapshot is not None and settings.snapshot is not None:
            top = await snapshot_client(snapshot, counting, spec, settings.snapshot)
        yield StorageStack(top, counting, retrying, flow)


async def check_source(storage: StorageClient, spec: SourceSpec) -> None:
    """Fail before mounting if the container is missing, the credentials are refused or the
    endpoint does not answer (raises the matching StorageError, saying which source).

    Given the top of a stack that serves a snapshot, the listing is answered by the snapshot
    (the stack was checked with a properties request when it opened), so no list request goes
    out."""
    try:
        await storage.list_page(spec.prefix, delimiter="/", max_results=1)
    except StorageError as exc:
        reason = explain(exc, endpoint_of(spec.account_url))
        raise type(exc)(f"cannot mount {spec.display}: {reason}") from None
