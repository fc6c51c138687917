"""Seeding Azurite's database directly (tests/helpers/azurite_seed.py): the blobs it writes are
real to Azurite and to the mount's storage client, and it refuses a version it was not written
for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from blobmount.storage._aio_bridge import AsyncioBridge
from blobmount.storage.azure import AzureStorageClient
from blobmount.testing.azurite import AzuriteServer
from blobmount.testing.pattern import pattern_bytes
from tests.helpers.azurite_seed import SeedError, etag_for, seed_location, verify_seeded

pytestmark = pytest.mark.azurite

ITEMS = [
    *((f"many/f{i:04d}.bin", pattern_bytes(f"f{i}", 0, i % 300)) for i in range(1_200)),
    ("naïve 文件/with space.txt", "unicode ✓\n".encode()),
    ("empty.bin", b""),
]
OTHER = [("x/y.txt", b"other container\n")]


async def listed(az: AzuriteServer, container: str, prefix: str, delimiter: str | None):
    with AsyncioBridge() as bridge:
        client = AzureStorageClient(az.account_url, container, az.credential(), bridge=bridge)
        pages, continuation = [], None
        try:
            while True:
                page = await client.list_page(
                    prefix, delimiter=delimiter, continuation=continuation
                )
                pages.append(page)
                if (continuation := page.continuation) is None:
                    return pages
        finally:
            await client.aclose()


def test_seeded_blobs_list_and_read_like_uploaded_ones(azurite, tmp_path):
    seed_location(tmp_path / "az", {"seeded": ITEMS, "other": OTHER})
    with AzuriteServer(location=tmp_path / "az") as az:
        verify_seeded(az, "seeded", ITEMS, samples=50)
        verify_seeded(az, "other", OTHER)
        pages = trio.run(listed, az, "seeded", "", None)
        blobs = [blob for page in pages for blob in page.blobs]
        assert [b.name for b in blobs] == sorted(name for name, _ in ITEMS)
        want = dict(ITEMS)
        for blob in blobs:
            assert blob.size == len(want[blob.name])
            assert blob.etag == etag_for("seeded", blob.name, want[blob.name])
        folders = trio.run(listed, az, "seeded", "", "/")
        assert [p for page in folders for p in page.prefixes] == ["many/", "naïve 文件/"]
        # Azurite goes on working normally on top of the seeded database
        az.upload("seeded", "many/late.bin", b"late")
        assert az.download("seeded", "many/late.bin")[0] == b"late"
        assert az.download("seeded", "many/f0007.bin")[0] == want["many/f0007.bin"]


def test_seeding_refuses_another_azurite_version(tmp_path):
    package = tmp_path / "node_modules" / "azurite"
    (package / "dist").mkdir(parents=True)
    (package / "package.json").write_text(json.dumps({"name": "azurite", "version": "9.9.9"}))
    exe = package / "dist" / "main.js"
    exe.write_text("")
    exe.chmod(0o755)
    with pytest.raises(SeedError, match=r"3\.37\.0.*9\.9\.9"):
        seed_location(tmp_path / "az", {"c": OTHER}, executable=str(exe))
    assert not Path(tmp_path / "az").exists()  # nothing written
