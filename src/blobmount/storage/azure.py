"""AzureStorageClient: the StorageClient for Azure Blob Storage (and Azurite).

Three REST calls (List Blobs, Get Blob Properties, a ranged Get Blob pinned with If-Match) sent
by the client itself, over HTTP/1.1 on trio (`storage.http1`), from the task that makes the
call. The Azure SDK's async pipeline cost about 1 ms of CPU per request (policy chain,
generated client, deserialisation), a bare aiohttp session behind the asyncio bridge 0.7-1.0 ms
with the bridge's thread hops, `http1` about 0.3 ms (docs/developer-notes/storage-client.md);
the daemon's CPU, not the network, bounds small-file reads. The SDK still provides what is worth
having from it: credential types, the key-derived SAS (see rest_auth) and the exception types
of azure-identity.

The one thing left on asyncio is an Azure AD token: azure-identity's async credentials run on an
AsyncioBridge loop thread, started when the first token is needed and asked again only when the
token is about to expire (`rest_auth.BearerAuth`). Every other credential costs no thread.

There are no hidden re-requests here: RetryingStorageClient retries transient failures with
backoff (`http1` sends a request again only when a kept-alive connection turns out closed before
any answer). Timeouts are per step: connecting (connect timeout) and each socket read (read
timeout). A body that trickles in a few bytes at a time never trips either, so every call also
has an overall deadline (`call_deadline_s`), after which it fails as StorageUnavailable.

Every network / credential exception is turned into a `blobmount.errors` exception by
`translate_error` alone, with a message of our own making: library texts can contain request
URLs, and a URL can carry a SAS signature. Throttling answers (503, 500, 429) become `Throttled`
and timeouts `TimedOut` (storage/overload.py), which the flow controller reads.

Every call carries an `x-ms-client-request-id` of its own (a UUID, in every request the call
sends), and its failure message names it, so a failure in the log can be handed to Azure support.
At DEBUG, each request also gets one log line (storage/request_log.py) with that id and the
`x-ms-request-id` storage answered with, written when its answer is done with (body read or
released).
"""

from __future__ import annotations

import email.utils
import inspect
import ipaddress
import logging
import os
import platform
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar
from urllib.parse import quote, urlsplit

import trio
from azure.core.exceptions import (
    ClientAuthenticationError,
    IncompleteReadError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)

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
from blobmount.storage.base import (
    MAX_LIST_PAGE,
    BlobProps,
    ListPage,
    RangeWithProps,
    StorageClient,
)
from blobmount.storage.body_parts import PartCutter
from blobmount.storage.http1 import Answer, Http1Client
from blobmount.storage.overload import THROTTLE_STATUSES, Throttled, TimedOut, add_request_id
from blobmount.storage.request_log import SentRequest, describe_url
from blobmount.storage.request_log import enabled as request_log_enabled
from blobmount.storage.rest_auth import BearerAuth, RequestAuth, request_auth
from blobmount.storage.rest_parse import (
    parse_list_page,
    props_from_get,
    props_from_headers,
    quoted_etag,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: the REST API version we speak (supported by Azure and by Azurite 3.37)
API_VERSION = "2024-08-04"
#: the product named in the User-Agent header when the caller gives none (the composition
#: layer gives "blobmount/<version>"); the Python version is added after it
DEFAULT_USER_AGENT = "blobmount"
#: an error answer's body (an XML reason) is read, to keep its connection, up to this size
_ERROR_BODY_BYTES = 64 * 1024
#: characters left as they are in a blob name in a URL path (as the SDK does)
_PATH_SAFE = "/~"

#: the slowest average body rate a call is given time for (see call_deadline_s)
MIN_BODY_BYTES_PER_S = 1024 * 1024
#: the most a list page weighs (5,000 names with metadata), for its deadline
_LIST_PAGE_BYTES = 4 * 1024 * 1024

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_TIMEOUT_TYPES: tuple[type[BaseException], ...] = (
    TimeoutError,
    ServiceRequestTimeoutError,
    ServiceResponseTimeoutError,
)
_TRANSIENT_TYPES: tuple[type[BaseException], ...] = (
    ServiceRequestError,
    ServiceResponseError,
    IncompleteReadError,
    TimeoutError,  # asyncio.TimeoutError is TimeoutError since 3.11
    # every failure on the way (refused, reset, no DNS answer, TLS, a body cut short: http1)
    OSError,
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


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


# -- error translation (the one place) -----------------------------------------------------


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def _error_code_of(exc: BaseException) -> str | None:
    code = getattr(exc, "error_code", None)
    if code is None:
        headers = _headers_of(exc)
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


def _headers_of(exc: BaseException) -> Mapping[str, str] | None:
    headers = getattr(exc, "headers", None)
    if headers is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
    return headers


def _retry_after_of(exc: BaseException) -> float | None:
    headers = _headers_of(exc)
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
    """Map any exception from the network, the SDK or a credential to a blobmount StorageError.

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
    if status in THROTTLE_STATUSES:
        return Throttled(
            f"{where}: storage busy ({detail})", status=status, retry_after_s=_retry_after_of(exc)
        )
    if status in _TRANSIENT_STATUS:
        return StorageUnavailable(
            f"{where}: storage unavailable ({detail})", retry_after_s=_retry_after_of(exc)
        )
    for cause in _causes(exc):
        if isinstance(cause, _TIMEOUT_TYPES):
            return TimedOut(f"{where}: timed out ({type(cause).__name__})")
        if isinstance(cause, _TRANSIENT_TYPES):
            return StorageUnavailable(f"{where}: connection failed ({type(cause).__name__})")
    if status is not None:
        return StorageError(f"{where} failed ({detail})")
    return StorageError(f"{where} failed ({type(exc).__name__})")


def _get_op(start: int, length: int) -> str:
    """What a ranged GET of `length` bytes at `start` does, as its error messages say it."""
    return f"GET bytes {start}-{start + length - 1} of" if length > 0 else "get properties of"


# -- the client ----------------------------------------------------------------------------


class HttpStatusError(Exception):
    """Storage answered with a status that is not success; carries what translate_error reads.

    Its text is the status alone: never the URL (which may carry a SAS)."""

    def __init__(self, status: int, headers: Mapping[str, str]) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status
        self.headers = headers
        self.error_code = headers.get("x-ms-error-code")


def _expected_body(resp: Answer, start: int) -> tuple[int, int]:
    """(offset of the body within the blob, its length) from a 206's Content-Range, or a 200's
    Content-Length (a server that ignored the range sends the whole blob)."""
    if resp.status == 200:
        return 0, int(resp.headers.get("Content-Length") or 0)
    span = resp.headers.get("Content-Range", "")  # "bytes 0-99/1000"
    try:
        first, last = span.split(" ", 1)[1].split("/", 1)[0].split("-")
        body_start, body_end = int(first), int(last)
    except (IndexError, ValueError):
        raise StorageUnavailable(f"unreadable Content-Range {span[:60]!r}") from None
    if body_start != start:
        raise StorageUnavailable(f"answer starts at byte {body_start}, not {start}")
    return body_start, body_end - body_start + 1


class AzureStorageClient(StorageClient):
    """A read-only view of one Azure Blob container.

    `credential` is one of: None (anonymous), AzureNamedKeyCredential or a key dict,
    AzureSasCredential or a SAS string, a TokenCredential (azure.identity, sync or aio); see
    rest_auth. Connections are made by the first call. A token credential's tokens are fetched
    on `bridge` (without one, the client starts a private bridge at the first token and stops
    it on aclose); other credentials never use it.
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
        user_agent: str = DEFAULT_USER_AGENT,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self._account_url = account_url.rstrip("/")
        self._container_name = container
        self._credential = credential
        self._account = account or account_name_from_url(self._account_url)
        self.location = f"{self._account}/{container}"
        self._auth: RequestAuth = request_auth(credential, self._account, container)
        parts = urlsplit(self._account_url)
        self._origin = f"{parts.scheme}://{parts.netloc}"
        #: the container's path on the endpoint ("/acct/cont" path style, "/cont" on Azure)
        self._container_path = f"{parts.path}/{quote(container, safe='')}"
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._max_connections = max_connections
        self._headers = {
            "x-ms-version": API_VERSION,
            "User-Agent": f"{user_agent} python/{platform.python_version()}",
        }
        self._bridge = bridge
        self._own_bridge = False
        #: made by the first call (its proxy settings are read then: a bad one fails a call)
        self._http: Http1Client | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"AzureStorageClient({self._account_url!r}, {self._container_name!r})"

    # -- requests ------------------------------------------------------------------------

    def _client(self) -> Http1Client:
        if self._http is None:
            self._http = Http1Client(
                self._origin,
                connect_timeout_s=self._connect_timeout_s,
                read_timeout_s=self._read_timeout_s,
                max_connections=self._max_connections,
                env=os.environ,
            )
        return self._http

    def _loop(self) -> AsyncioBridge:
        """The asyncio loop a token credential runs on, started when first needed."""
        if self._bridge is None:
            self._bridge = AsyncioBridge("blobmount-token").start()
            self._own_bridge = True
        return self._bridge

    async def _authorize(self, headers: dict[str, str]) -> str:
        auth = self._auth
        if isinstance(auth, BearerAuth):
            if auth.apply_cached(headers):
                return ""
            bridge = self._loop()
            return await bridge.run(lambda: auth.authorize(headers))
        return await auth.authorize(headers)  # awaits nothing: no event loop of its own

    async def _send(
        self, method: str, target: str, headers: dict[str, str], request_id: str
    ) -> Answer:
        """Send one request; a success answer is returned with its body unread (the caller
        reads or releases it), any other raises HttpStatusError. `target` is the path and
        query, already percent-encoded."""
        headers = self._headers | headers
        headers["x-ms-client-request-id"] = request_id
        query = await self._authorize(headers)
        # the request's debug line (DEBUG only): described before a SAS joins the target, and
        # timed from here, after any token fetch
        sent = (
            SentRequest.start(
                method,
                describe_url(self._origin + target, self._account_url, self._account),
                headers,
                request_id,
            )
            if request_log_enabled()
            else None
        )
        if query:
            target = f"{target}{'&' if '?' in target else '?'}{query}"
        try:
            resp = await self._client().request(method, target, headers)
        except BaseException as exc:
            if sent is not None:
                sent.failed(exc)
            raise
        if sent is not None:
            resp.on_done = lambda done: sent.answered(
                done.status, done.headers.get("x-ms-request-id"), done.body_bytes
            )
        if resp.status not in (200, 206):
            await self._drop_error_body(resp)
            raise HttpStatusError(resp.status, resp.headers)
        return resp

    async def _drop_error_body(self, resp: Answer) -> None:
        """Read a small error answer's body (its XML reason is in x-ms-error-code anyway), so
        its connection serves the next request; a large or slow one closes it."""
        declared = resp.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) <= _ERROR_BODY_BYTES:
            with trio.move_on_after(self._read_timeout_s):
                try:
                    await resp.read_into(_discard)
                except OSError:
                    pass
        resp.release()

    def _blob_target(self, name: str) -> str:
        return f"{self._container_path}/{quote(name, safe=_PATH_SAFE)}"

    async def _list(
        self,
        prefix: str,
        delimiter: str | None,
        continuation: str | None,
        max_results: int,
        request_id: str,
    ) -> ListPage:
        query = f"restype=container&comp=list&include=metadata&maxresults={max_results}"
        for key, value in (("prefix", prefix), ("delimiter", delimiter), ("marker", continuation)):
            if value:
                query += f"&{key}={quote(value, safe='')}"
        resp = await self._send("GET", f"{self._container_path}?{query}", {}, request_id)
        try:
            body = await resp.read()
        finally:
            resp.release()
        return parse_list_page(body)

    async def _get_properties(self, name: str, request_id: str) -> BlobProps:
        resp = await self._send("HEAD", self._blob_target(name), {}, request_id)
        resp.release()
        return props_from_headers(name, resp.headers)

    async def _get_range(
        self, name: str, etag: str, start: int, lengths: Sequence[int], request_id: str
    ) -> list[bytes]:
        """One ranged GET of `sum(lengths)` bytes, cut into parts as it arrives (`body_parts`:
        each byte copied once)."""
        resp = await self._ranged_get(name, etag, start, sum(lengths), request_id)
        if isinstance(resp, BlobProps):
            return []
        return await self._read_parts(resp, name, start, lengths)

    async def _get_range_with_props(
        self, name: str, etag: str, start: int, length: int, request_id: str
    ) -> RangeWithProps:
        """One ranged GET, and the blob's properties from its answer's headers
        (`rest_parse.props_from_get`); length 0: the properties alone (HEAD)."""
        if length <= 0:
            return RangeWithProps(b"", await self._unchanged(name, etag, request_id))
        resp = await self._ranged_get(name, etag, start, length, request_id)
        if isinstance(resp, BlobProps):
            return RangeWithProps(b"", resp)
        try:
            props = props_from_get(name, resp.status, resp.headers)
        except ValueError as exc:
            resp.release()
            raise StorageUnavailable(f"GET {self._where(name)}: {exc}") from None
        parts = await self._read_parts(resp, name, start, (length,))
        return RangeWithProps(parts[0] if parts else b"", props)

    async def _ranged_get(
        self, name: str, etag: str, start: int, length: int, request_id: str
    ) -> Answer | BlobProps:
        """Send a GET of `length` (> 0) bytes from `start` pinned to `etag`; the answer with its
        body unread, or the blob's properties when the range starts at or after its end."""
        headers = {
            "x-ms-range": f"bytes={start}-{start + length - 1}",
            "If-Match": quoted_etag(etag),
        }
        try:
            return await self._send("GET", self._blob_target(name), headers, request_id)
        except HttpStatusError as exc:
            if exc.status_code == 416:
                # Azure answers 416 when the range starts at/after the end (or the blob is empty)
                return await self._past_end(name, etag, start, exc, request_id)
            if exc.status_code == 412:
                # a deleted blob also fails If-Match: tell "gone" from "changed"
                await self._get_properties(name, request_id)  # raises 404 if gone
            raise

    async def _read_parts(
        self, resp: Answer, name: str, start: int, lengths: Sequence[int]
    ) -> list[bytes]:
        """The body of a ranged GET from `start`, cut into `lengths` as it arrives; releases
        `resp`. A body shorter than its headers said is StorageUnavailable."""
        try:
            body_start, expected = _expected_body(resp, start)
            cutter = PartCutter(start - body_start, lengths)
            await resp.read_into(cutter.feed)
        finally:
            resp.release()
        if cutter.body_bytes != expected:
            raise StorageUnavailable(
                f"GET {self._where(name)} bytes {start}+{sum(lengths)}: short body "
                f"({cutter.body_bytes} of {expected} bytes)"
            )
        return cutter.finish()

    async def _unchanged(self, name: str, etag: str, request_id: str) -> BlobProps:
        """The blob's properties; raises unless it is still there with `etag`."""
        props = await self._get_properties(name, request_id)
        if props.etag != quoted_etag(etag):
            # `from None`: also when called while handling an error whose text may quote a URL
            raise BlobChanged(
                f"GET {self._where(name)}: the blob changed since it was opened"
            ) from None
        return props

    async def _past_end(
        self, name: str, etag: str, start: int, exc: HttpStatusError, request_id: str
    ) -> BlobProps:
        """The blob's properties if a 416 meant "nothing there" (the range starts at or after
        the end); raises `exc` otherwise."""
        props = await self._unchanged(name, etag, request_id)
        if start < props.size:
            raise exc  # 416 for a range inside the blob: not something we asked for
        return props

    # -- calls ---------------------------------------------------------------------------

    def _where(self, name: str) -> str:
        return f"{self.location}/{name}"

    def call_deadline_s(self, body_bytes: int) -> float:
        """The longest one call may take: connecting, the first byte within a read timeout, one
        more read timeout of slack, and the body at MIN_BODY_BYTES_PER_S.

        A call on a healthy connection never gets near it; it stops a body that trickles
        forever.
        """
        return (
            self._connect_timeout_s + 2 * self._read_timeout_s + body_bytes / MIN_BODY_BYTES_PER_S
        )

    async def _call(
        self,
        op: Callable[[], str],
        name: str,
        fn: Callable[[str], Awaitable[T]],
        *,
        body_bytes: int = 0,
    ) -> T:
        # `op()` says what the call does ("get properties of"), for an error's message only:
        # most calls never build it. `fn` gets the call's client request id.
        if self._closed:
            raise StorageError(f"{op()} {self._where(name)} failed: the storage client is closed")
        deadline_s = self.call_deadline_s(body_bytes)
        request_id = str(uuid.uuid4())
        try:
            # a cancelled request closes its connection (http1)
            with trio.move_on_after(deadline_s):
                return await fn(request_id)
        except Exception as exc:
            err = translate_error(exc, op(), self._where(name))
            add_request_id(err, request_id)
            if err is exc:
                raise
            # `from None`: a library's exception text may quote a URL with a SAS in it
            log.debug("%s (%s)", err, type(exc).__name__)
            raise err from None
        timed_out = TimedOut(
            f"{op()} {self._where(name)}: timed out (no complete answer in {deadline_s:.1f}s)"
        )
        add_request_id(timed_out, request_id)
        raise timed_out

    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        continuation: str | None = None,
        max_results: int = MAX_LIST_PAGE,
    ) -> ListPage:
        return await self._call(
            lambda: "list",
            prefix,
            lambda request_id: self._list(prefix, delimiter, continuation, max_results, request_id),
            body_bytes=_LIST_PAGE_BYTES,
        )

    async def get_properties(self, name: str) -> BlobProps:
        return await self._call(
            lambda: "get properties of",
            name,
            lambda request_id: self._get_properties(name, request_id),
        )

    async def get_range(self, name: str, etag: str, start: int, length: int) -> bytes:
        if length <= 0:
            # nothing to fetch, but keep the contract: a gone or changed blob still fails (in
            # one call, so that its failure names the request id like every other)
            await self._call(
                lambda: "get properties of",
                name,
                lambda request_id: self._unchanged(name, etag, request_id),
            )
            return b""
        parts = await self.get_range_parts(name, etag, start, (length,))
        return parts[0] if parts else b""

    async def get_range_parts(
        self, name: str, etag: str, start: int, lengths: Sequence[int]
    ) -> list[bytes]:
        if not lengths or min(lengths) <= 0:
            raise ValueError(f"parts must have lengths: {lengths!r}")
        length = sum(lengths)
        return await self._call(
            lambda: _get_op(start, length),
            name,
            lambda request_id: self._get_range(name, etag, start, lengths, request_id),
            body_bytes=length,
        )

    async def get_range_with_props(
        self, name: str, etag: str, start: int, length: int
    ) -> RangeWithProps:
        return await self._call(
            lambda: _get_op(start, length),
            name,
            lambda request_id: self._get_range_with_props(name, etag, start, length, request_id),
            body_bytes=max(0, length),
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        http, self._http = self._http, None
        try:
            if http is not None:
                await http.aclose()
            await self._close_credential()
        except Exception as exc:
            log.warning("closing %s: %s", self.location, type(exc).__name__)
        finally:
            if self._own_bridge and self._bridge is not None:
                self._bridge.close()

    async def _close_credential(self) -> None:
        """Close a token credential that holds connections of its own (azure-identity's)."""
        close = getattr(self._credential, "close", None)
        if close is None:
            return
        if not inspect.iscoroutinefunction(close):
            close()
        elif self._bridge is not None:  # an async credential never used opened nothing
            try:
                await self._bridge.run(close)
            except BridgeClosedError:
                pass  # the loop is gone and took the credential's session with it

    # kept for callers that want to share the bridge's loop (tests, benchmarks)
    @property
    def bridge(self) -> AsyncioBridge | None:
        return self._bridge


def _discard(_piece: bytes) -> None:
    pass
