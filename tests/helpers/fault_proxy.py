"""A fault-injecting reverse HTTP proxy for tests: mount → proxy → Azurite, faults switchable
from the test while the mount runs.

    proxy = FaultProxy(azurite.port).start()
    uri = proxy.url(container)                     # http://127.0.0.1:<port>/devstoreaccount1/<c>
    proxy.set_fault(throttle(retry_after="1", limit=3))    # next 3 range GETs: 503 + Retry-After
    proxy.set_fault(reset_mid_body(kinds=ALL_KINDS))      # every request: reset after 64 KiB
    proxy.clear()                                  # back to a transparent proxy; stalls released
    proxy.counts("range")                          # {'requests': n, 'forwarded': m, 'stall': k}
    proxy.set_admission(Admission(max_in_flight=4))   # 503 ServerBusy beyond 4 requests at once
    proxy.set_admission(Admission(per_second=50))     # ... beyond 50 requests a second
    proxy.stop()

It runs an asyncio loop on a daemon thread of the test process; every control method is
thread-safe. Requests are passed on byte for byte (a path-style URL names the account in the path,
and Shared Key signatures cover the path and the x-ms-*/standard headers, not Host, so the proxy
is invisible to the signature). Each client connection gets its own upstream connection, so
keep-alive works on both sides.

Requests are sorted into kinds: `list` (comp=list), `properties` (HEAD), `range` (a GET of a
blob) and `other`. A fault applies to the kinds it names (range GETs by default), optionally only
to blobs whose name contains `blob`, to a `fraction` of those (seeded, so runs repeat), and to at
most `limit` requests. What it does:

- `status`: answer with an error status (503 + Retry-After, 500, 403, 404, ...) and never ask
  upstream; the connection stays usable;
- `reset`: pass the response on for `after_bytes` of its body, then reset the connection (RST);
- `short`: same, but close the connection cleanly, so the body ends before its Content-Length;
- `truncate`: rewrite Content-Length to `after_bytes` and send that much: a well-framed response
  whose body is shorter than its Content-Range promises;
- `stall`: hold the request for `stall_s` seconds (None: until `release()`/`clear()`) before
  passing it on: a slow first byte;
- `stall_body`: send headers and `after_bytes` of the body, then stall as above, then the rest;
- `trickle`: send the body `trickle_bytes` at a time every `trickle_interval_s`: never stalls
  long enough for a per-read timeout, and never finishes in reasonable time.

Admission (`set_admission`) is a server over its targets, on top of any fault: a request beyond
`max_in_flight` being forwarded at once, or beyond `per_second` in the current second, is
answered 503 ServerBusy (outcome `busy`) without being forwarded.

Abandoned upstream bodies are drained, not dropped: Azurite leaks a file descriptor per stored
block of a GET its client abandons (DESIGN.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
ACCOUNT = "devstoreaccount1"
KINDS = ("list", "properties", "range", "other")
ALL_KINDS = frozenset(KINDS)
RANGE_ONLY = frozenset({"range"})
#: at most this many requests are remembered in `records()`
_RECORD_LIMIT = 200_000
_READ_CHUNK = 256 * 1024
_ACTIONS = frozenset({"status", "reset", "short", "truncate", "stall", "stall_body", "trickle"})


@dataclass(frozen=True, slots=True)
class Fault:
    """What to do to matching requests; see the module docstring for each `action`."""

    action: str
    status: int = 503
    code: str = "ServerBusy"
    retry_after: str | None = None
    after_bytes: int = 64 * 1024
    stall_s: float | None = None
    trickle_bytes: int = 1024
    trickle_interval_s: float = 0.25
    kinds: frozenset[str] = RANGE_ONLY
    blob: str | None = None
    fraction: float = 1.0
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.action not in _ACTIONS:
            raise ValueError(f"unknown fault action {self.action!r}")
        if not self.kinds <= ALL_KINDS:
            raise ValueError(f"unknown request kinds {set(self.kinds - ALL_KINDS)}")


def throttle(retry_after: str | None = "1", **kw: Any) -> Fault:
    """503 Server Busy, with a Retry-After header (seconds or an HTTP date)."""
    return Fault("status", status=503, code="ServerBusy", retry_after=retry_after, **kw)


def server_error(status: int = 500, code: str = "InternalError", **kw: Any) -> Fault:
    return Fault("status", status=status, code=code, **kw)


def reset_mid_body(after_bytes: int = 64 * 1024, **kw: Any) -> Fault:
    return Fault("reset", after_bytes=after_bytes, **kw)


def cut_short(after_bytes: int = 64 * 1024, **kw: Any) -> Fault:
    return Fault("short", after_bytes=after_bytes, **kw)


def truncate(after_bytes: int = 64 * 1024, **kw: Any) -> Fault:
    return Fault("truncate", after_bytes=after_bytes, **kw)


def stall(seconds: float | None = None, **kw: Any) -> Fault:
    return Fault("stall", stall_s=seconds, **kw)


def stall_mid_body(seconds: float | None = None, after_bytes: int = 64 * 1024, **kw: Any) -> Fault:
    return Fault("stall_body", stall_s=seconds, after_bytes=after_bytes, **kw)


def trickle(bytes_per_step: int = 1024, interval_s: float = 0.25, **kw: Any) -> Fault:
    return Fault("trickle", trickle_bytes=bytes_per_step, trickle_interval_s=interval_s, **kw)


@dataclass(frozen=True, slots=True)
class Admission:
    """What the proxy lets through, like a storage account over its targets: None is no limit."""

    max_in_flight: int | None = None
    per_second: int | None = None
    retry_after: str | None = None
    kinds: frozenset[str] = ALL_KINDS


@dataclass(frozen=True, slots=True)
class Record:
    """One request the proxy saw."""

    at: float  # time.monotonic() when its head arrived
    kind: str
    method: str
    blob: str  # blob name ('' for container-level requests)
    range: str | None  # x-ms-range / Range header
    if_match: str | None
    outcome: str  # 'forwarded' or the fault action
    client_request_id: str | None = None  # the x-ms-client-request-id header


@dataclass(slots=True)
class _Request:
    head: bytes
    method: str
    target: str
    headers: dict[str, str]  # lower-case names
    body: bytes = b""
    kind: str = "other"
    blob: str = ""


@dataclass(slots=True)
class _State:
    fault: Fault | None = None
    used: int = 0  # requests the current fault was applied to
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    records: list[Record] = field(default_factory=list)
    stalled: int = 0  # requests being held right now
    admission: Admission | None = None
    forwarding: int = 0  # requests being forwarded right now
    second: int = 0  # the current second of `per_second`, and requests admitted in it
    admitted: int = 0
    most_forwarding: int = 0


class _Upstream:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class FaultProxy:
    """Reverse proxy from 127.0.0.1:<port> to `upstream_host:upstream_port` with faults."""

    def __init__(self, upstream_port: int, upstream_host: str = HOST) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._lock = threading.Lock()
        self._state = _State()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._release: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    # -- lifecycle (test thread) ---------------------------------------------------------

    def start(self) -> FaultProxy:
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._open())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
                loop.run_until_complete(self._shutdown())
            finally:
                loop.close()

        self._thread = threading.Thread(target=main, name="fault-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    async def _open(self) -> None:
        self._release = asyncio.Event()
        self._server = await asyncio.start_server(self._serve, HOST, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    def stop(self) -> None:
        """Stop serving and cut every connection. Idempotent."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._thread = None
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        thread.join(30)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def account_url(self) -> str:
        """Path-style URL of the emulator account through the proxy."""
        return f"http://{HOST}:{self.port}/{ACCOUNT}"

    def url(self, container: str) -> str:
        """Path-style URL of `container` through the proxy."""
        return f"{self.account_url}/{container}"

    # -- control (test thread) ------------------------------------------------------------

    def set_fault(self, fault: Fault | None) -> None:
        """Apply `fault` to requests from now on (None: pass everything). Releases stalls held
        by the previous fault."""
        with self._lock:
            self._state.fault = fault
            self._state.used = 0
        self.release()

    def set_admission(self, admission: Admission | None) -> None:
        """Answer 503 beyond `admission`'s limits from now on (None: admit everything)."""
        with self._lock:
            self._state.admission = admission
            self._state.most_forwarding = 0

    @property
    def most_forwarding(self) -> int:
        """The most requests forwarded at once since the last `set_admission`."""
        with self._lock:
            return self._state.most_forwarding

    def clear(self) -> None:
        """No more faults; requests held by a stall go on at once."""
        self.set_fault(None)

    def release(self) -> None:
        """Let every request held by a stall go on now."""
        loop, event = self._loop, self._release
        if loop is None or event is None:
            return

        def swap() -> None:
            assert self._release is not None
            self._release.set()
            self._release = asyncio.Event()

        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(swap)

    def counts(self, kind: str | None = None) -> dict[str, int]:
        """{'requests': n, 'forwarded': n, <action>: n} for one kind, or summed over all."""
        out: Counter[str] = Counter()
        with self._lock:
            for (k, outcome), n in self._state.counts.items():
                if kind is None or k == kind:
                    out[outcome] += n
                    out["requests"] += n
        return dict(out)

    def records(self, kind: str | None = None) -> list[Record]:
        with self._lock:
            return [r for r in self._state.records if kind is None or r.kind == kind]

    @property
    def stalled(self) -> int:
        """Requests held by a stall right now."""
        with self._lock:
            return self._state.stalled

    def wait_until(self, predicate: Callable[[FaultProxy], bool], timeout_s: float) -> bool:
        """Poll `predicate(self)` until it holds or `timeout_s` passes; True if it held."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.02)
        return predicate(self)

    # -- the proxy (loop thread) ----------------------------------------------------------

    def _admit(self, req: _Request) -> Fault | None:
        """A 503 if the admission limits refuse `req` (counted and recorded as `busy`), else
        None; an admitted request is counted as forwarding until `_done_forwarding`."""
        with self._lock:
            state = self._state
            rule = state.admission
            if rule is None or req.kind not in rule.kinds:
                return None
            busy = rule.max_in_flight is not None and state.forwarding >= rule.max_in_flight
            if rule.per_second is not None and not busy:
                now = int(time.monotonic())
                if now != state.second:
                    state.second, state.admitted = now, 0
                busy = state.admitted >= rule.per_second
                state.admitted += 0 if busy else 1
            if not busy:
                state.forwarding += 1
                state.most_forwarding = max(state.most_forwarding, state.forwarding)
                return None
            state.counts[(req.kind, "busy")] += 1
            if len(state.records) < _RECORD_LIMIT:
                state.records.append(
                    Record(time.monotonic(), req.kind, req.method, req.blob, None, None, "busy")
                )
            return throttle(retry_after=rule.retry_after)

    def _done_forwarding(self, req: _Request) -> None:
        with self._lock:
            rule = self._state.admission
            if rule is not None and req.kind in rule.kinds and self._state.forwarding > 0:
                self._state.forwarding -= 1

    def _choose(self, req: _Request) -> Fault | None:
        """The fault for this request (or None), counted and recorded."""
        with self._lock:
            state = self._state
            fault = state.fault
            hit = (
                fault is not None
                and req.kind in fault.kinds
                and (fault.blob is None or fault.blob in req.blob)
                and (fault.limit is None or state.used < fault.limit)
                and (fault.fraction >= 1.0 or state.rng.random() < fault.fraction)
            )
            if hit:
                state.used += 1
            outcome = fault.action if hit and fault is not None else "forwarded"
            state.counts[(req.kind, outcome)] += 1
            if len(state.records) < _RECORD_LIMIT:
                state.records.append(
                    Record(
                        time.monotonic(),
                        req.kind,
                        req.method,
                        req.blob,
                        req.headers.get("x-ms-range") or req.headers.get("range"),
                        req.headers.get("if-match"),
                        outcome,
                        req.headers.get("x-ms-client-request-id"),
                    )
                )
            return fault if hit else None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        # drain() then waits until the kernel has the bytes, so a reset comes after them
        writer.transport.set_write_buffer_limits(0)
        upstream: _Upstream | None = None
        try:
            while True:
                req = await _read_request(reader)
                if req is None:
                    return
                refused = self._admit(req)
                if refused is not None:
                    writer.write(_error_reply(req, refused))
                    await writer.drain()
                    continue
                try:
                    fault = self._choose(req)
                    if fault is not None and fault.action == "status":
                        writer.write(_error_reply(req, fault))
                        await writer.drain()
                        continue
                    if fault is not None and fault.action == "stall":
                        await self._stall(fault)
                    if upstream is None:
                        upstream = _Upstream(*await asyncio.open_connection(*self._upstream))
                    keep = await self._forward(req, fault, writer, upstream)
                finally:
                    self._done_forwarding(req)
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass  # the client or Azurite went away: nothing left to answer
        except asyncio.CancelledError:
            # stop() cancels us; ending quietly keeps asyncio from logging each connection
            _reset(writer)
        finally:
            if upstream is not None:
                upstream.close()
            if not writer.is_closing():
                writer.close()
            self._tasks.discard(task)

    async def _stall(self, fault: Fault) -> None:
        assert self._release is not None
        release = self._release
        with self._lock:
            self._state.stalled += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(release.wait(), fault.stall_s)
        finally:
            with self._lock:
                self._state.stalled -= 1

    async def _forward(
        self, req: _Request, fault: Fault | None, writer: asyncio.StreamWriter, up: _Upstream
    ) -> bool:
        """Pass one request on and its response back, applying `fault` to the body. Returns
        whether the client connection can carry another request."""
        up.writer.write(req.head + req.body)
        await up.writer.drain()
        head = await _read_head(up.reader)
        if head is None:
            _reset(writer)
            return False
        status, headers = _parse_response_head(head)
        framing = _framing(req.method, status, headers)
        action = fault.action if fault is not None else None
        after = fault.after_bytes if fault is not None else 0
        if action == "truncate" and isinstance(framing, int) and framing > after:
            head = _set_content_length(head, after)
        writer.write(head)
        await writer.drain()
        body = _body(up.reader, framing)
        sent = 0
        try:
            async for chunk in body:
                if (
                    action in ("reset", "short", "truncate", "stall_body")
                    and sent + len(chunk) > after
                ):
                    writer.write(chunk[: after - sent])
                    await writer.drain()
                    rest = chunk[after - sent :]
                    sent = after
                    if action == "stall_body":
                        assert fault is not None
                        await self._stall(fault)
                        writer.write(rest)
                        await writer.drain()
                        action = None  # the rest goes as it comes
                        continue
                    # finish reading upstream, so Azurite is not left with an abandoned GET
                    async for _ in body:
                        pass
                    if action == "truncate":
                        return True
                    if action == "reset":
                        await asyncio.sleep(0.05)  # let the client read what was sent first
                        _reset(writer)
                    else:
                        writer.close()
                    return False
                if action == "trickle":
                    assert fault is not None
                    for i in range(0, len(chunk), fault.trickle_bytes):
                        writer.write(chunk[i : i + fault.trickle_bytes])
                        await writer.drain()
                        await asyncio.sleep(fault.trickle_interval_s)
                else:
                    writer.write(chunk)
                    await writer.drain()
                sent += len(chunk)
        finally:
            await body.aclose()
        return framing != "close"


# -- HTTP/1.1 framing (just what Azure and Azurite speak) ------------------------------------


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise
        return None


def _headers(lines: list[bytes]) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in lines:
        name, _, value = line.decode("latin-1").partition(":")
        out[name.strip().lower()] = value.strip()
    return out


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    head = await _read_head(reader)
    if head is None:
        return None
    lines = head[:-4].split(b"\r\n")
    method, target, _ = lines[0].decode("latin-1").split(" ", 2)
    headers = _headers(lines[1:])
    req = _Request(head, method, target, headers)
    length = int(headers.get("content-length", "0") or 0)
    if length:
        req.body = await reader.readexactly(length)
    parts = urlsplit(target)
    query = parse_qs(parts.query)
    segments = parts.path.lstrip("/").split("/", 2)  # account, container, blob
    req.blob = unquote(segments[2]) if len(segments) == 3 else ""
    if "list" in query.get("comp", []):
        req.kind = "list"
    elif method == "HEAD" and req.blob:
        req.kind = "properties"
    elif method == "GET" and req.blob and "comp" not in query:
        req.kind = "range"
    return req


def _parse_response_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head[:-4].split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    return status, _headers(lines[1:])


def _framing(method: str, status: int, headers: dict[str, str]) -> int | str:
    """Body length in bytes, 'chunked', or 'close' (the body runs until the connection ends)."""
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return 0
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return "chunked"
    if "content-length" in headers:
        return int(headers["content-length"])
    return "close"


def _set_content_length(head: bytes, length: int) -> bytes:
    lines = head[:-4].split(b"\r\n")
    new = f"Content-Length: {length}".encode()
    out = [new if line.lower().startswith(b"content-length:") else line for line in lines]
    return b"\r\n".join(out) + b"\r\n\r\n"


async def _body(reader: asyncio.StreamReader, framing: int | str) -> AsyncIterator[bytes]:
    """The response body as raw wire bytes (chunk framing included), as it arrives."""
    if framing == "close":
        while chunk := await reader.read(_READ_CHUNK):
            yield chunk
        return
    if framing == "chunked":
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0], 16)
            if size == 0:
                last = size_line
                while True:  # optional trailers, then an empty line
                    line = await reader.readuntil(b"\r\n")
                    last += line
                    if line == b"\r\n":
                        break
                yield last
                return
            yield size_line + await reader.readexactly(size + 2)
    remaining = int(framing)
    while remaining > 0:
        chunk = await reader.read(min(_READ_CHUNK, remaining))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", remaining)
        remaining -= len(chunk)
        yield chunk


def _error_reply(req: _Request, fault: Fault) -> bytes:
    body = (
        '<?xml version="1.0" encoding="utf-8"?><Error>'
        f"<Code>{fault.code}</Code><Message>injected by the test proxy</Message></Error>"
    ).encode()
    headers = {
        "Content-Type": "application/xml",
        "Content-Length": str(len(body)),
        "x-ms-error-code": fault.code,
        "x-ms-request-id": "fault-proxy",
        "x-ms-version": "2025-01-05",
    }
    if fault.retry_after is not None:
        headers["Retry-After"] = fault.retry_after
    reason = {
        403: "Forbidden",
        404: "Not Found",
        412: "Precondition Failed",
        500: "Internal Server Error",
        503: "Service Unavailable",
    }.get(fault.status, "Error")
    head = [f"HTTP/1.1 {fault.status} {reason}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + (b"" if req.method == "HEAD" else body)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST instead of FIN (what a crashed or overloaded server looks like)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


__all__ = [
    "ALL_KINDS",
    "KINDS",
    "RANGE_ONLY",
    "Admission",
    "Fault",
    "FaultProxy",
    "Record",
    "cut_short",
    "reset_mid_body",
    "server_error",
    "stall",
    "stall_mid_body",
    "throttle",
    "trickle",
    "truncate",
]
