"""Snapshots through the composition layer: made from one flat listing, written atomically,
and stacked on a mount's storage by `open_storage`, which then never lists; a damaged or
foreign snapshot stops `open_storage` before any storage is opened or used."""

from __future__ import annotations

import math
import os
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from blobmount.compose.download import download_config, run_download
from blobmount.compose.snapshots import create_snapshot, snapshot_info
from blobmount.compose.storage import check_source, open_storage
from blobmount.errors import ConfigError
from blobmount.settings import load_settings
from blobmount.snapshots.client import SnapshotStorageClient
from blobmount.snapshots.format import SnapshotError
from blobmount.source import parse_source
from blobmount.storage.memory import InMemoryStorageClient

SPEC = parse_source("az://data")
BLOBS = 12_345  # three list pages of 5,000


def _store() -> InMemoryStorageClient:
    store = InMemoryStorageClient("acct/data")
    for i in range(BLOBS):
        store.put(f"train/d{i // 1000:02d}/f{i:05d}.bin", b"%d" % i, md5=False)
    store.put("val/v.bin", b"v" * 100)
    return store


class Opened:
    """A storage factory over one store that says whether it was opened."""

    def __init__(self, store: InMemoryStorageClient) -> None:
        self.store = store
        self.times = 0

    def __call__(self):
        @asynccontextmanager
        async def opener():
            self.times += 1
            yield self.store

        return opener()


def _settings(tmp_path: Path, **overrides):
    return load_settings({"HOME": str(tmp_path)}, **overrides)


async def _create(tmp_path: Path, store: InMemoryStorageClient, name: str = "s.bmsnap"):
    target = str(tmp_path / name)
    made = await create_snapshot(_settings(tmp_path), SPEC, target, storage_factory=Opened(store))
    return target, made


async def test_making_a_snapshot_costs_one_flat_listing(tmp_path):
    store = _store()
    target, made = await _create(tmp_path, store)
    assert made.header.entries == BLOBS + 1
    assert made.header.total_bytes == sum(len(b"%d" % i) for i in range(BLOBS)) + 100
    assert made.list_requests == math.ceil((BLOBS + 1) / 5000)
    assert made.header.location == "acct/data"
    assert made.header.source == SPEC.display
    info = await snapshot_info(_settings(tmp_path), target)
    assert info.header == made.header
    assert info.file_bytes == made.file_bytes
    # written atomically: no temporary left beside it
    assert os.listdir(tmp_path) == ["s.bmsnap"]


async def test_a_stack_with_a_snapshot_serves_the_namespace_without_listing(tmp_path):
    store = _store()
    target, _ = await _create(tmp_path, store)
    settings = _settings(tmp_path, snapshot=target)
    async with open_storage(settings, SPEC, Opened(store)) as stack:
        assert isinstance(stack.client, SnapshotStorageClient)
        await check_source(stack.client, SPEC)  # what the daemon calls before mounting
        page = await stack.client.list_page("train/", delimiter="/")
        assert page.prefixes == tuple(f"train/d{d:02d}/" for d in range(13))
        props = await stack.client.get_properties("train/d03/f03210.bin")
        assert await stack.client.get_range(props.name, props.etag, 0, 100) == b"3210"
        stats = stack.counting.statistics()
        # one properties request when the stack opened (are we allowed in?), then reads only
        assert (stats.list_requests, stats.properties_requests, stats.range_requests) == (0, 1, 1)


async def test_a_download_with_a_snapshot_copies_the_recorded_versions(tmp_path):
    store = _store()
    target, _ = await _create(tmp_path, store)
    store.put("val/new-since.bin", b"new")  # not in the snapshot: not copied
    store.put("val/v.bin", b"rewritten")  # changed since: refused, never the new bytes
    settings = _settings(tmp_path, snapshot=target)
    spec = parse_source("az://data/val")
    dest = tmp_path / "out"
    config = download_config(settings, spec, dest)
    outcome = await run_download(settings, spec, config, False, Opened(store))
    assert outcome.requests["list_requests"] == 0
    assert not outcome.result.ok
    assert not (dest / "new-since.bin").exists()
    assert not (dest / "v.bin").exists()


async def test_a_damaged_snapshot_stops_before_storage_is_opened(tmp_path):
    store = _store()
    target, _ = await _create(tmp_path, store)
    data = Path(target).read_bytes()
    truncated = tmp_path / "cut.bmsnap"
    truncated.write_bytes(data[: len(data) // 2])
    corrupt = tmp_path / "bad.bmsnap"
    corrupt.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    opened = Opened(store)
    for path, word in ((truncated, "truncated"), (corrupt, "corrupt"), (tmp_path / "no", "read")):
        with pytest.raises(SnapshotError, match=word):
            async with open_storage(_settings(tmp_path, snapshot=str(path)), SPEC, opened):
                pass
    assert opened.times == 0
    assert issubclass(SnapshotError, ConfigError)  # exit status 2: retrying cannot help


async def test_a_snapshot_of_another_container_or_prefix_is_refused(tmp_path):
    store = _store()
    target, _ = await _create(tmp_path, store)
    other = InMemoryStorageClient("acct/other")
    settings = _settings(tmp_path, snapshot=target)
    with pytest.raises(SnapshotError, match=r"acct/data.*not of"):
        async with open_storage(settings, parse_source("az://other"), Opened(other)):
            pass
    val = str(tmp_path / "val.bmsnap")
    await create_snapshot(
        _settings(tmp_path), parse_source("az://data/val"), val, storage_factory=Opened(store)
    )
    with pytest.raises(SnapshotError, match="records only val/"):
        async with open_storage(
            _settings(tmp_path, snapshot=val), parse_source("az://data/train"), Opened(store)
        ):
            pass
    # a prefix inside the recorded one is fine
    async with open_storage(
        _settings(tmp_path, snapshot=target), parse_source("az://data/val"), Opened(store)
    ) as stack:
        page = await stack.client.list_page("val/", delimiter="/")
        assert [b.name for b in page.blobs] == ["val/v.bin"]


async def test_making_a_snapshot_ignores_a_snapshot_in_the_settings(tmp_path):
    # DATASET_MOUNT_SNAPSHOT set in a job's environment must not make `create` copy the old one
    store = _store()
    old, _ = await _create(tmp_path, store, "old.bmsnap")
    store.put("train/added.bin", b"x")
    settings = _settings(tmp_path, snapshot=old)
    made = await create_snapshot(
        settings, SPEC, str(tmp_path / "new.bmsnap"), storage_factory=Opened(store)
    )
    assert made.header.entries == BLOBS + 2


async def test_a_snapshot_blob_uri_must_name_a_blob(tmp_path):
    with pytest.raises(SnapshotError, match="names a container"):
        await snapshot_info(_settings(tmp_path), "az://snapshots")


def test_the_setting_makes_a_local_path_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _settings(tmp_path, snapshot="s.bmsnap").snapshot == str(tmp_path / "s.bmsnap")
    uri = "https://acct.blob.core.windows.net/c/s.bmsnap"
    assert _settings(tmp_path, snapshot=uri).snapshot == uri
