"""AzuriteServer: start a private Azurite blob emulator on a free loopback port, and fill it.

Used by the test fixtures, the demo and the benchmarks:

    with AzuriteServer() as az:
        az.create_container("data")
        az.upload("data", "dir/file.bin", b"...")
        ... AzureStorageClient(az.account_url, "data", az.credential()) ...

Uploads go through the synchronous SDK with the single-put limit raised to 512 MiB, so each blob
is ONE Put Blob: Azurite leaks a descriptor per stored block when a client abandons a ranged GET
mid-body (see DESIGN.md), and single-block blobs keep that harmless.

`python -m blobmount.testing.azurite --port N --pidfile F` runs one in the foreground (for the
demo): it prints the connection string and stops Azurite on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:
    from azure.core.credentials import AzureNamedKeyCredential
    from azure.storage.blob import BlobServiceClient

log = logging.getLogger(__name__)

ACCOUNT = "devstoreaccount1"
#: the emulator's well-known key (public, documented by Microsoft; not a secret)
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
HOST = "127.0.0.1"
ENV_EXECUTABLE = "BLOBMOUNT_AZURITE"
_RELATIVE_EXE = Path(".tools") / "node_modules" / ".bin" / "azurite-blob"
#: one Put Blob for anything up to this size (the SDK's default would split at 64 MiB)
MAX_SINGLE_PUT = 512 * 1024 * 1024
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 5.0


def find_azurite() -> str:
    """Path of the azurite-blob executable, or FileNotFoundError saying how to get one."""
    configured = os.environ.get(ENV_EXECUTABLE)
    if configured:
        if os.access(configured, os.X_OK):
            return configured
        raise FileNotFoundError(f"{ENV_EXECUTABLE}={configured!r} is not an executable file")
    starts: list[Path] = []
    for start in (Path(__file__).resolve().parent, Path.cwd().resolve()):
        starts.append(start)
        for folder in (start, *start.parents):
            candidate = folder / _RELATIVE_EXE
            if candidate.exists() and os.access(candidate, os.X_OK):
                return str(candidate)
    on_path = shutil.which("azurite-blob")
    if on_path:
        return on_path
    raise FileNotFoundError(
        f"azurite-blob not found (looked for {_RELATIVE_EXE} in "
        + " and ".join(f"{s} and its parents" for s in starts)
        + f", then on PATH); run `make setup` to install it, or set {ENV_EXECUTABLE}"
    )


def connection_string(account_url: str) -> str:
    """A connection string for the emulator's account whose blob endpoint is `account_url`
    (Azurite's own, or a proxy in front of it)."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
        f"BlobEndpoint={account_url};"
    )


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class AzuriteServer:
    """One Azurite blob emulator process, on 127.0.0.1, stopped by stop(). In memory, or with
    `location`, on disk in that folder (which stop() leaves in place, to be served again)."""

    def __init__(
        self,
        port: int | None = None,
        *,
        executable: str | None = None,
        location: str | os.PathLike[str] | None = None,
    ) -> None:
        self._requested_port = port
        self._executable = executable
        self._location = None if location is None else Path(location)
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: str | None = None
        self._stderr_path: str | None = None
        self._port: int | None = None
        self._service: BlobServiceClient | None = None
        self._lock = threading.Lock()

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> AzuriteServer:
        if self._proc is not None:
            return self
        exe = self._executable or find_azurite()
        port = self._requested_port or free_port()
        self._workdir = tempfile.mkdtemp(prefix="blobmount-azurite-")
        self._stderr_path = os.path.join(self._workdir, "stderr.log")
        if self._location is None:
            persistence = ["--inMemoryPersistence"]
        else:
            persistence = ["--location", str(self._location)]
        args = [
            exe,
            "--blobHost",
            HOST,
            "--blobPort",
            str(port),
            *persistence,
            "--silent",
            "--skipApiVersionCheck",
            "--loose",
            # no traffic off this machine: Azurite sends telemetry to Azure by default
            "--disableTelemetry",
        ]
        # Azurite refuses --location together with --inMemoryPersistence; in memory it works in
        # the current directory instead, so give it the temp dir as cwd
        with open(self._stderr_path, "wb") as stderr:
            proc = self._proc = subprocess.Popen(
                args,
                cwd=self._workdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,  # own process group: a terminal's ^C is ours to relay
            )
        self._port = port
        try:
            self._wait_ready(proc, port)
        except BaseException:
            self.stop()
            raise
        log.info("Azurite (pid %d) listening on %s:%d", proc.pid, HOST, port)
        return self

    def _wait_ready(self, proc: subprocess.Popen[bytes], port: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            code = proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"Azurite exited with status {code} while starting: {self._stderr_tail()}"
                )
            try:
                conn = http.client.HTTPConnection(HOST, port, timeout=2)
                try:
                    conn.request("GET", f"/{ACCOUNT}?comp=list")
                    conn.getresponse().read()  # any HTTP answer (even 403) means it is up
                finally:
                    conn.close()
                return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Azurite did not answer on {HOST}:{port} within "
                    f"{START_TIMEOUT_S:.0f}s: {self._stderr_tail()}"
                )
            time.sleep(0.05)

    def _stderr_tail(self, limit: int = 4000) -> str:
        if not self._stderr_path:
            return "(no stderr)"
        try:
            text = Path(self._stderr_path).read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            return "(no stderr)"
        return text.strip() or "(stderr empty)"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; remove the temp dir. Idempotent."""
        with self._lock:
            proc, self._proc = self._proc, None
            service, self._service = self._service, None
            workdir, self._workdir = self._workdir, None
        if service is not None:
            with contextlib.suppress(Exception):
                service.close()
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

    def __enter__(self) -> AzuriteServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- where it is ---------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("Azurite not started")
        return self._port

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("Azurite not running")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def account(self) -> str:
        return ACCOUNT

    @property
    def account_key(self) -> str:
        return ACCOUNT_KEY

    @property
    def account_url(self) -> str:
        return f"http://{HOST}:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return connection_string(self.account_url)

    def credential(self) -> AzureNamedKeyCredential:
        """A fresh shared-key credential for the emulator account."""
        # lazy: the Azure SDK loads only when the emulator is filled
        from azure.core.credentials import AzureNamedKeyCredential

        return AzureNamedKeyCredential(ACCOUNT, ACCOUNT_KEY)

    # -- filling it (synchronous SDK) ----------------------------------------------------

    def _svc(self) -> BlobServiceClient:
        with self._lock:
            if self._service is None:
                # lazy: the Azure SDK loads only when the emulator is filled
                from azure.storage.blob import BlobServiceClient

                self._service = BlobServiceClient.from_connection_string(
                    self.connection_string,
                    max_single_put_size=MAX_SINGLE_PUT,
                    max_block_size=MAX_SINGLE_PUT,
                )
            return self._service

    def create_container(self, name: str, *, public: bool = False) -> None:
        """Create `name` (no error if it exists); `public` lets anyone list and read it."""
        # lazy: the Azure SDK loads only when the emulator is filled
        from azure.core.exceptions import ResourceExistsError

        with contextlib.suppress(ResourceExistsError):
            self._svc().create_container(name, public_access="container" if public else None)

    def delete_container(self, name: str) -> None:
        # lazy: the Azure SDK loads only when the emulator is filled
        from azure.core.exceptions import ResourceNotFoundError

        with contextlib.suppress(ResourceNotFoundError):
            self._svc().delete_container(name)

    def upload(
        self,
        container: str,
        name: str,
        data: bytes,
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> str:
        """Create or replace one blob with a single Put Blob. Returns its ETag."""
        if len(data) > MAX_SINGLE_PUT:
            raise ValueError(f"{name}: {len(data)} bytes is over the single-put limit")
        blob = self._svc().get_blob_client(container, name)
        result = blob.upload_blob(
            data, overwrite=True, metadata=dict(metadata) if metadata else None
        )
        return str(result["etag"])

    def upload_folder_marker(self, container: str, name: str) -> str:
        """A zero-length blob with metadata hdi_isfolder=true (how ADLS marks a folder)."""
        return self.upload(container, name.rstrip("/"), b"", metadata={"hdi_isfolder": "true"})

    def upload_many(
        self, container: str, items: Iterable[tuple[str, bytes]], threads: int = 16
    ) -> int:
        """Upload (name, data) pairs in parallel. Returns how many blobs were written."""
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            futures = [pool.submit(self.upload, container, name, data) for name, data in items]
            for fut in futures:
                fut.result()  # re-raise the first failure
        return len(futures)

    def put_many(
        self,
        container: str,
        items: Sequence[tuple[str, bytes]],
        threads: int = 16,
        timeout_s: float = 60.0,
    ) -> list[str]:
        """Upload blobs fast: plain Put Blob requests with a container SAS over kept-alive
        connections, skipping the SDK's per-request pipeline (which costs more CPU than Azurite
        itself for small blobs). Returns the ETags, in the order of `items`."""
        # lazy: the Azure SDK loads only when the emulator is filled
        from azure.storage.blob import ContainerSasPermissions, generate_container_sas

        key = self.connection_string.split("AccountKey=")[1].split(";")[0]
        sas = generate_container_sas(
            ACCOUNT,
            container,
            account_key=key,
            permission=ContainerSasPermissions(write=True, create=True),
            expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=12),
        )
        work: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        for i in range(len(items)):
            work.put(i)
        etags = [""] * len(items)
        errors: list[str] = []

        def worker() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
            try:
                while not errors and (i := work.get()) is not None:
                    name, data = items[i]
                    conn.request(
                        "PUT",
                        f"/{ACCOUNT}/{container}/{quote(name)}?{sas}",
                        body=data,
                        headers={"x-ms-blob-type": "BlockBlob"},
                    )
                    response = conn.getresponse()
                    response.read()
                    etag = response.getheader("ETag")
                    if response.status != 201 or not etag:
                        errors.append(f"{name}: HTTP {response.status} {response.reason}")
                        return
                    etags[i] = etag
            except OSError as exc:  # reported to the caller, not lost in a thread
                errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                conn.close()

        pool = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, threads))]
        for thread in pool:
            work.put(None)
            thread.start()
        for thread in pool:
            thread.join()
        if errors:
            raise RuntimeError(f"uploads failed: {errors[:5]}")
        return etags

    def download(self, container: str, name: str) -> tuple[bytes, str]:
        """A blob's bytes and ETag, through Azurite's API."""
        downloader = self._svc().get_blob_client(container, name).download_blob()
        return downloader.readall(), str(downloader.properties.etag)

    def delete_blob(self, container: str, name: str) -> None:
        self._svc().get_blob_client(container, name).delete_blob()


# -- foreground mode for the demo ----------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m blobmount.testing.azurite",
        description="Run an in-memory Azurite blob emulator on 127.0.0.1 until SIGTERM/SIGINT.",
    )
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--pidfile", help="write this process's PID here while running")
    parser.add_argument("--container", action="append", default=[], help="create a container")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("azure").setLevel(logging.WARNING)  # the SDK logs every request at INFO

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    server = AzuriteServer(args.port or None)
    try:
        server.start()
        for name in args.container:
            server.create_container(name)
        if args.pidfile:
            Path(args.pidfile).write_text(f"{os.getpid()}\n")
        print(f"AZURE_STORAGE_CONNECTION_STRING={server.connection_string}", flush=True)
        print(f"account_url={server.account_url}", flush=True)
        while not stop.wait(0.5):
            if not server.running:
                print(f"Azurite died: {server._stderr_tail()}", file=sys.stderr)
                return 1
        return 0
    finally:
        server.stop()
        if args.pidfile:
            with contextlib.suppress(FileNotFoundError):
                Path(args.pidfile).unlink()


if __name__ == "__main__":
    sys.exit(main())
