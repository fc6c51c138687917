"""A download run: the mount's storage stack under a `Downloader`, stopped cleanly by signals.

Shared by `blobmount download` and `blobmount.download()`; each front end turns the `Outcome`
into its own output (a summary and an exit status, or a result and exceptions).
"""

from __future__ import annotations

import logging
import signal
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import trio

from blobmount.compose.storage import StorageFactory, open_storage
from blobmount.download_mode.downloader import DownloadConfig, Downloader, DownloadResult
from blobmount.download_mode.manifest import manifest_path
from blobmount.download_mode.progress import BarReporter, make_reporter, report_progress
from blobmount.download_mode.transfer import DEFAULT_PART_SIZE
from blobmount.errors import BlobmountError, ConfigError
from blobmount.progress import logging_around
from blobmount.runstate import state_dir
from blobmount.settings import Settings
from blobmount.source import SourceSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Outcome:
    result: DownloadResult
    interrupted: str | None  # the signal's name, when one stopped the download
    requests: dict[str, Any]  # storage request counts (CountingStorageClient)
    retries: dict[str, Any]


def download_config(
    settings: Settings,
    spec: SourceSpec,
    dest: Path,
    *,
    part_size: int = DEFAULT_PART_SIZE,
    verify: bool = False,
    includes: tuple[str, ...] = (),
    excludes: tuple[str, ...] = (),
    direct_io: bool = True,
) -> DownloadConfig:
    """The downloader's config for copying `spec` to `dest` (made absolute). The resume state
    (the manifest) is kept outside `dest`, in $XDG_STATE_HOME/blobmount/downloads, one file per
    source and destination, so `dest` ends up holding the prefix's files and nothing else.

    Raises:
        ConfigError: a value no download can run with (e.g. an empty glob).
    """
    try:
        return DownloadConfig(
            dest=dest.absolute(),
            manifest_path=manifest_path(downloads_state_dir(), spec.display, dest.absolute()),
            prefix=spec.prefix,
            transfers=settings.downloader_threads,
            part_size=part_size,
            verify=verify,
            includes=includes,
            excludes=excludes,
            direct_io=direct_io,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def downloads_state_dir() -> Path:
    """Where downloads keep their manifests: $XDG_STATE_HOME/blobmount/downloads."""
    return state_dir() / "downloads"


async def run_download(
    settings: Settings,
    spec: SourceSpec,
    config: DownloadConfig,
    progress: bool = True,
    storage_factory: StorageFactory | None = None,
) -> Outcome:
    """Open the storage stack the mount uses, run a Downloader, stop cleanly on SIGINT/SIGTERM.

    `storage_factory` replaces the Azure client (tests pass the in-memory store); retries
    (AZUREML_DATASET_HTTP_RETRY_COUNT) and request counting are wrapped around it either way.
    Must run in the main thread (it installs signal handlers).

    Raises:
        BlobmountError: the download could not start (bad destination, credentials...).
    """
    reporter = make_reporter(enabled=progress)
    interrupted: str | None = None
    failed_to_start: BlobmountError | None = None
    async with open_storage(settings, spec, storage_factory) as stack:
        downloader = Downloader(stack.client, config)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def on_signal() -> None:
                    nonlocal interrupted
                    async for signum in signals:
                        interrupted = signal.Signals(signum).name
                        log.info("%s: stopping; completed files are kept", interrupted)
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(on_signal)
                if reporter is not None:
                    nursery.start_soon(report_progress, downloader.statistics, reporter)
                try:
                    with logging_around(isinstance(reporter, BarReporter)):
                        await downloader.run()
                except BlobmountError as exc:
                    # kept out of the nursery, which would wrap it in an ExceptionGroup
                    failed_to_start = exc
                nursery.cancel_scope.cancel()
        if reporter is not None:
            reporter.close(downloader.statistics())
    if failed_to_start is not None:
        raise failed_to_start
    return Outcome(
        downloader.result(),
        interrupted,
        asdict(stack.counting.statistics()),
        asdict(stack.retrying.statistics()),
    )
