"""AzureStorageClient: the StorageClient for Azure Blob Storage (and Azurite).

Built on `azure.storage.blob.aio` with its aiohttp transport. The SDK is asyncio-only and the
mount runs on trio, so every SDK object lives on an AsyncioBridge loop thread: the container
client and its aiohttp session are created lazily by the first call, *on the loop thread*, and
closed there by `aclose()`. Trio code only ever awaits `bridge.run(...)`.

The SDK's own retries are disabled (retry_total=0); RetryingStorageClient retries transient
failures with backoff. Two things the SDK does regardless, and what bounds them:
- aiohttp's timeouts are per step: connecting (connect timeout) and each socket read (read
  timeout). A body that trickles in a few bytes at a time never trips either, so every call also
  has an overall deadline (`call_deadline_s`), after which it fails as StorageUnavailable.
- `download_blob` re-requests a body that breaks off or stalls up to 3 times with 1 s pauses
  (a fixed loop in azure.storage.blob.aio._download_async, not governed by retry_total or any
  other option). Those hidden re-requests run inside the same deadline.

Every SDK / aiohttp / asyncio exception is turned into a `blobmount.errors` exception by
`translate_error` alone, with a message of our own making: the SDK's texts can contain request
URLs, and a URL can carry a SAS signature.
"""

from __future__ import annotations

import asyncio
import email.utils
import inspect
import ipaddress
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import urlsplit

import aiohttp
import trio
from azure.core import MatchConditions
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    IncompleteReadError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.core.pipeline.transport import AioHttpTransport
from azure.storage.blob.aio import BlobClient, BlobPrefix, ContainerClient

from blobmount.errors import (
    BlobChanged,
    BlobmountError,
    BlobNotFound,
    ContainerNotFound,
    CredentialError,
    StorageError,
    StorageUnavailable,
)
from blobmount.storage._aio_bridge import AsyncioBridge, BridgeClosedError
from blobmount.storage.base import MAX_LIST_PAGE, BlobProps, ListPage, StorageClient

if TYPE_CHECKING:
    from azure.storage.blob import BlobProperties

log = logging.getLogger(__name__)

T = TypeVar("T")

#: a range up to this size is fetched with ONE GET; bigger ranges go in pieces of this size
_SINGLE_GET_BYTES = 256 * 1024 * 1024
#: BlobClients kept per client: building one costs ~0.1 ms (URL parsing, generated client)
_BLOB_CLIENT_CACHE = 1024
#: how much aiohttp hands the SDK per read; the SDK's default (4 KiB with a custom transport)
#: would cost ~500 Python iterations per 2 MiB block
_READ_CHUNK_BYTES = 4 * 1024 * 1024

#: the slowest average body rate a call is given time for (see call_deadline_s)
MIN_BODY_BYTES_PER_S = 1024 * 1024
#: the most a list page weighs (5,000 names with metadata), for its deadline
_LIST_PAGE_BYTES = 4 * 1024 * 1024

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
#: cleanup tasks in flight (see _container)
_background: set[asyncio.Task[None]] = set()

_TIMEOUT_TYPES: tuple[type[BaseException], ...] = (
    TimeoutError,
    ServiceRequestTimeoutError,
    ServiceResponseTimeoutError,
)
_TRANSIENT_TYPES: tuple[type[BaseException], ...] = (
    ServiceRequestError,
    ServiceResponseError,
    IncompleteReadError,
    aiohttp.ClientError,
    TimeoutError,  # asyncio.TimeoutError is TimeoutError since 3.11
    ConnectionError,
)


def account_name_from_url(account_url: str) -> str:
    """The storage account an endpoint URL points at.

    Path-style endpoints (an IP address or localhost host, as Azurite uses) carry the account as
    the first path segment; the usual https://<account>.blob.<suffix> carries it in the host.
    """
    parts = urlsplit(account_url)
    host = parts.hostname or ""
    first_segment = parts.path.strip("/").split("/", 1)[0]
    path_style = host == "localhost" or _is_ip(host)
    if first_segment and (path_style or ".blob." not in host):
        return first_segment
    return host.split(".", 1)[0]


def _proxy_configured() -> bool:
    names = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")
    return any(os.environ.get(n) or os.environ.get(n.lower()) for n in names)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


# -- error translation (the one place) -----------------------------------------------------


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None and isinstance(exc, aiohttp.ClientResponseError):
        status = exc.status
    return status if isinstance(status, int) else None


def _error_code_of(exc: BaseException) -> str | None:
    code = getattr(exc, "error_code", None)
    if code is None:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
        if headers is not None:
            code = headers.get("x-ms-error-code")
    if code is None:
        return None
    return str(getattr(code, "value", code))


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date), or None."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _retry_after_of(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    retry_ms = headers.get("x-ms-retry-after-ms")
    if retry_ms is not None:
        try:
            return max(0.0, float(retry_ms) / 1000.0)
        except ValueError:
            pass
    return parse_retry_after(headers.get("Retry-After"))


def _causes(exc: BaseException) -> list[BaseException]:
    """exc and what it wraps (the SDK nests transport errors in inner_exception / __cause__)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(seen) < 8 and current not in seen:
        seen.append(current)
        inner = getattr(current, "inner_exception", None)
        current = inner if isinstance(inner, BaseException) else current.__cause__
    return seen


def translate_error(exc: BaseException, op: str, what: str) -> StorageError:
    """Map any exception from the SDK / aiohttp / asyncio to a blobmount StorageError.

    `op` says what we were doing ("GET range 0-2097151 of"), `what` names the blob or prefix
    ("acct/container/name"). The message is built here and never includes the SDK's text.
    """
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, BlobmountError):
        return StorageError(f"{op} {what} failed: {exc}")
    if isinstance(exc, BridgeClosedError):
        return StorageError(f"{op} {what} failed: the storage client is closed")

    status = _status_of(exc)
    code = _error_code_of(exc)
    detail = " ".join(p for p in (f"HTTP {status}" if status else None, code) if p)
    where = f"{op} {what}"

    if isinstance(exc, ResourceModifiedError) or status == 412:
        return BlobChanged(f"{where}: the blob changed since it was opened ({detail})")
    if isinstance(exc, ClientAuthenticationError) or status in (401, 403):
        if status is None:
            # a token credential failed before any request was made
            return CredentialError(f"{where}: could not get a token ({type(exc).__name__})")
        return CredentialError(f"{where}: storage refused the credentials ({detail})")
    if isinstance(exc, ResourceNotFoundError) or status == 404:
        if code == "ContainerNotFound":
            return ContainerNotFound(f"{where}: container not found ({detail})")
        return BlobNotFound(f"{where}: not found ({detail})")
    if status in _TRANSIENT_STATUS:
        return StorageUnavailable(
            f"{where}: storage unavailable ({detail})", retry_after_s=_retry_after_of(exc)
        )
    for cause in _causes(exc):
        if isinstance(cause, _TRANSIENT_TYPES):
            kind = "timed out" if isinstance(cause, _TIMEOUT_TYPES) else "connection failed"
            return StorageUnavailable(f"{where}: {kind} ({type(cause).__name__})")
    if status is not None:
        return StorageError(f"{where} failed ({detail})")
    return StorageError(f"{where} failed ({type(exc).__name__})")


# -- the client ----------------------------------------------------------------------------


def _is_marker(size: int, metadata: dict[str, str] | None) -> bool:
    if size != 0 or not metadata:
        return False
    return any(k.lower() == "hdi_isfolder" and v.lower() == "true" for k, v in metadata.items())


def _quoted_etag(etag: str) -> str:
    # headers carry '"0x8D…"', list results carry 0x8D… bare: keep one form so they compare equal
    if etag.startswith(('"', "W/")):
        return etag
    return f'"{etag}"'


def _props(p: BlobProperties) -> BlobProps:
    md5 = p.content_settings.content_md5 if p.content_settings is not None else None
    size = int(p.size or 0)
    return BlobProps(
        name=p.name,
        size=size,
        etag=_quoted_etag(p.etag),
        last_modified=p.last_modified.timestamp() if p.last_modified else 0.0,
        content_md5=bytes(md5) if md5 else None,
        is_dir_marker=_is_marker(size, p.metadata),
    )


class AzureStorageClient(StorageClient):
    """A read-only view of one Azure Blob container.

    `credential` is anything the SDK accepts: None (anonymous), AzureNamedKeyCredential or a
    key dict, AzureSasCredential or a SAS string, an async TokenCredential (azure.identity.aio).
    The SDK client is created lazily on the bridge's loop by the first call. Without a `bridge`
    the client starts (and on aclose stops) a private one.
    """

    def __init__(
        self,
        account_url: str,
        container: str,
        credential: object = None,
        *,
        bridge: AsyncioBridge | None = None,
        account: str | None = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 30.0,
        max_connections: int = 64,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self._account_url = account_url.rstrip("/")
        self._container_name = container
        self._credential = credential
        self._account = account or account_name_from_url(self._account_url)
        self.location = f"{self._account}/{container}"
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._max_connections = max_connections
        self._own_bridge = bridge is None
        self._bridge = bridge if bridge is not None else AsyncioBridge().start()
        # created and used on the loop thread only
        self._client: ContainerClient | None = None
        self._blob_clients: OrderedDict[str, BlobClient] = OrderedDict()
        self._closed = False

    def __repr__(self) -> str:
        return f"AzureStorageClient({self._account_url!r}, {self._container_name!r})"

    # -- loop-thread side ----------------------------------------------------------------

    def _container(self) -> ContainerClient:
        """The SDK container client; call on the loop thread only."""
        if self._client is None:
            if self._closed:
                raise BridgeClosedError("client closed")
            # our own connector: aiohttp's default pool (100 total) would queue parallel GETs
            connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0)
            session = aiohttp.ClientSession(
                connector=connector,
                # honour HTTPS_PROXY/NO_PROXY like the SDK does, but only when one is set: with
                # trust_env, aiohttp re-reads ~/.netrc and the proxy variables in a thread on
                # every request (~30% of the daemon's CPU on small files, measured)
                trust_env=_proxy_configured(),
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
            )
            transport = AioHttpTransport(
                session=session,
                session_owner=True,
                connection_timeout=self._connect_timeout_s,
                read_timeout=self._read_timeout_s,
                connection_data_block_size=_READ_CHUNK_BYTES,
            )
            try:
                self._client = ContainerClient(
                    self._account_url,
                    self._container_name,
                    # the caller vouches for the type; the SDK rejects what it cannot use
                    credential=cast(Any, self._credential),
                    transport=transport,
                    retry_total=0,  # RetryingStorageClient does the retrying
                    max_single_get_size=_SINGLE_GET_BYTES,
                    max_chunk_get_size=_SINGLE_GET_BYTES,
                )
            except BaseException:
                # we run inside a coroutine on the loop: the session can still be closed
                task = asyncio.get_running_loop().create_task(session.close())
                _background.add(task)  # asyncio keeps only a weak reference to tasks
                task.add_done_callback(_background.discard)
                raise
        return self._client

    def _blob(self, name: str) -> BlobClient:
        """A (cached) BlobClient for `name`; call on the loop thread only."""
        blob = self._blob_clients.get(name)
        if blob is None:
            blob = self._container().get_blob_client(name)
            self._blob_clients[name] = blob
            if len(self._blob_clients) > _BLOB_CLIENT_CACHE:
                self._blob_clients.popitem(last=False)
        else:
            self._blob_clients.move_to_end(name)
        return blob

    async def _list(
        self, prefix: str, delimiter: str | None, continuation: str | None, max_results: int
    ) -> ListPage:
        container = self._container()
        if delimiter:
            pages = container.walk_blobs(
                name_starts_with=prefix or None,
                include=["metadata"],
                delimiter=delimiter,
                results_per_page=max_results,
            ).by_page(continuation_token=continuation)
        else:
            pages = container.list_blobs(
                name_starts_with=prefix or None,
                include=["metadata"],
                results_per_page=max_results,
            ).by_page(continuation_token=continuation)
        blobs: list[BlobProps] = []
        prefixes: list[str] = []
        try:
            page = await pages.__anext__()
        except StopAsyncIteration:
            return ListPage((), (), None)
        async for item in page:
            # walk_blobs yields BlobPrefix (a pager itself) for folders, BlobProperties for blobs
            if isinstance(item, BlobPrefix):
                prefixes.append(item.name)
            else:
                blobs.append(_props(item))
        token = getattr(pages, "continuation_token", None)
        return ListPage(tuple(blobs), tuple(prefixes), token or None)

    async def _get_properties(self, name: str) -> BlobProps:
        return _props(await self._blob(name).get_blob_properties())

    async def _get_range(self, name: str, etag: str, start: int, length: int) -> bytes:
        blob = self._blob(name)
        try:
            downloader = await blob.download_blob(
                offset=start,
                length=length,
                etag=_quoted_etag(etag),
                match_condition=MatchConditions.IfNotModified,
                max_concurrency=1,
            )
        except HttpResponseError as exc:
            status = exc.status_code
            if status == 416:
                # Azure answers 416 when the range starts at/after the end (or the blob is empty)
                return await self._past_end(blob, name, etag, start, exc)
            if status == 412:
                # a deleted blob also fails If-Match: tell "gone" from "changed"
                await blob.get_blob_properties()  # raises 404 if gone
            raise
        expected = downloader.size  # min(length, blob size - start), from Content-Range
        # chunks() hands over the body the SDK already holds (one bytes object for ranges up to
        # _SINGLE_GET_BYTES); readall() would copy it through a BytesIO twice more
        parts = [chunk async for chunk in downloader.chunks()]
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        if len(body) != expected:
            raise StorageUnavailable(
                f"GET {self._where(name)} bytes {start}+{length}: short body "
                f"({len(body)} of {expected} bytes)"
            )
        return body

    async def _past_end(
        self, blob: BlobClient, name: str, etag: str, start: int, exc: HttpResponseError
    ) -> bytes:
        props = await blob.get_blob_properties()
        if _quoted_etag(props.etag) != _quoted_etag(etag):
            raise BlobChanged(f"GET {self._where(name)}: the blob changed since it was opened")
        if start >= int(props.size or 0):
            return b""
        raise exc  # 416 for a range inside the blob: not something we asked for

    async def _aclose(self) -> None:
        client, self._client = self._client, None
        self._blob_clients.clear()
        try:
            if client is not None:
                await client.close()
        finally:
            close = getattr(self._credential, "close", None)
            if close is not None and inspect.iscoroutinefunction(close):
                await close()

    # -- trio side -----------------------------------------------------------------------

    def _where(self, name: str) -> str:
        return f"{self.location}/{name}"

    def call_deadline_s(self, body_bytes: int) -> float:
        """The longest one call may take: connecting, the first byte within a read timeout, one
        more read timeout of slack, and the body at MIN_BODY_BYTES_PER_S.

        A call on a healthy connection never gets near it; it stops a body that trickles
        forever, and the SDK's own re-requests of a broken body (see the module docstring).
        """
        return (
            self._connect_timeout_s + 2 * self._read_timeout_s + body_bytes / MIN_BODY_BYTES_PER_S
        )

    async def _call(
        self, op: str, name: str, fn: Callable[[], Awaitable[T]], *, body_bytes: int = 0
    ) -> T:
        if self._closed:
            raise StorageError(f"{op} {self._where(name)} failed: the storage client is closed")
        deadline_s = self.call_deadline_s(body_bytes)
        try:
            # cancelling the bridge call cancels the SDK coroutine and its connection
            with trio.move_on_after(deadline_s):
                return await self._bridge.run(fn)
        except Exception as exc:
            err = translate_error(exc, op, self._where(name))
            if err is exc:
                raise
            # `from None`: the SDK's exception text may quote a URL with a SAS in it
            log.debug("%s (%s)", err, type(exc).__name__)
            raise err from None
        raise StorageUnavailable(
            f"{op} {self._where(name)}: timed out (no complete answer in {deadline_s:.1f}s)"
        )

    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        continuation: str | None = None,
        max_results: int = MAX_LIST_PAGE,
    ) -> ListPage:
        return await self._call(
            "list",
            prefix,
            lambda: self._list(prefix, delimiter, continuation, max_results),
            body_bytes=_LIST_PAGE_BYTES,
        )

    async def get_properties(self, name: str) -> BlobProps:
        return await self._call("get properties of", name, lambda: self._get_properties(name))

    async def get_range(self, name: str, etag: str, start: int, length: int) -> bytes:
        if length <= 0:
            # nothing to fetch, but keep the contract: a gone or changed blob still fails
            props = await self.get_properties(name)
            if props.etag != etag:
                raise BlobChanged(f"GET {self._where(name)}: the blob changed since it was opened")
            return b""
        return await self._call(
            f"GET bytes {start}-{start + length - 1} of",
            name,
            lambda: self._get_range(name, etag, start, length),
            body_bytes=length,
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._bridge.run(self._aclose)
        except BridgeClosedError:
            pass  # the loop is gone and took the session with it
        except Exception as exc:
            log.warning("closing %s: %s", self.location, type(exc).__name__)
        finally:
            if self._own_bridge:
                self._bridge.close()

    # kept for callers that want to share the bridge's loop (tests, benchmarks)
    @property
    def bridge(self) -> AsyncioBridge:
        return self._bridge
