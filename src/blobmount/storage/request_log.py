"""The debug log of storage requests: one line per HTTP request the Azure client sends.

Each line names what a user hands to Azure support, and nothing secret:

    GET devstoreaccount1/data/a/b.bin range=0-2097151 status=206 ms=3.1 bytes=2097152
    x-ms-client-request-id=<uuid> x-ms-request-id=<id>

(one line in the log). The path is the request URL's path (percent-encoded, as sent) with the
account in front; the query string is never logged, because a SAS travels in it. A listing
shows its prefix as a path and the word ``list``. A request that got no answer shows
``status=-`` and the exception's class name.

The client (storage/azure.py, over storage/http1.py) times a request from sending it until its
answer is done with, so `ms` includes reading the body. Nothing here runs unless DEBUG is on for
this module's logger: the client asks `enabled()` once per request and, if not, keeps no record
at all.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from urllib.parse import quote, unquote

log = logging.getLogger(__name__)

#: where a listing's prefix sits in our own List Blobs query (built by AzureStorageClient)
_PREFIX_PARAM = "prefix="


def enabled() -> bool:
    """Whether request lines are logged (DEBUG on for this logger); cheap, ask once per request."""
    return log.isEnabledFor(logging.DEBUG)


def describe_url(url: str, account_url: str, account: str) -> str:
    """The request's path for the log: "<account>/<container>/<blob>" as sent, without the
    query; for a listing, the container path, its prefix and " list"."""
    path, _, query = url.partition("?")
    if path.startswith(account_url):
        path = path[len(account_url) :]
    where = f"{account}{path}" if path.startswith("/") else path
    if "comp=list" not in query:
        return where
    prefix = ""
    for param in query.split("&"):
        if param.startswith(_PREFIX_PARAM):
            prefix = quote(unquote(param[len(_PREFIX_PARAM) :]), safe="/~")
    return f"{where}/{prefix} list"


@dataclass(frozen=True, slots=True)
class SentRequest:
    """A request on its way: what its log line says before the answer is known."""

    method: str
    path: str
    range: str | None  # "0-2097151", from the x-ms-range header
    client_request_id: str
    started: float  # time.perf_counter()

    @classmethod
    def start(
        cls, method: str, path: str, headers: dict[str, str], client_request_id: str
    ) -> SentRequest:
        span = headers.get("x-ms-range")
        return cls(
            method,
            path,
            span.removeprefix("bytes=") if span else None,
            client_request_id,
            time.perf_counter(),
        )

    def answered(self, status: int, server_request_id: str | None, body_bytes: int | None) -> None:
        """Log the request with the status storage answered (once the answer is released)."""
        self._log(f"status={status}", server_request_id, body_bytes)

    def failed(self, exc: BaseException) -> None:
        """Log a request that got no answer (connection failed, timed out, cancelled)."""
        self._log(f"status=- error={type(exc).__name__}", None, None)

    def _log(self, outcome: str, server_request_id: str | None, body_bytes: int | None) -> None:
        ms = (time.perf_counter() - self.started) * 1000.0
        log.debug(
            "%s %s%s %s ms=%.1f%s x-ms-client-request-id=%s x-ms-request-id=%s",
            self.method,
            self.path,
            f" range={self.range}" if self.range else "",
            outcome,
            ms,
            f" bytes={body_bytes}" if body_bytes is not None else "",
            self.client_request_id,
            server_request_id or "-",
        )
