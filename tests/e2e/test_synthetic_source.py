"""A real FUSE mount of a synthetic:// source: every name listed and every byte read through
the mount is what the synthetic dataset says it is. No Azurite: the source is made up in the
daemon (blobmount.storage.synthetic), which is what makes it a benchmark tool."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import pytest

from blobmount.source import parse_source
from blobmount.storage.synthetic import SyntheticDataset, expected_bytes
from tests.e2e.conftest import worker_processes_env
from tests.helpers.mount import MountedDaemon
from tests.helpers.synthetic_reads import read_whole, wrong_files

pytestmark = pytest.mark.fuse

URI = (
    "synthetic://bench?small_files=300&small_size=25000&per_folder=100&large_files=1"
    "&large_size=20MB"
)
DATASET = SyntheticDataset.from_query(parse_source(URI).synthetic_query or "")
MiB = 1024 * 1024


@pytest.fixture
def synthetic_mount(fuse_ok, tmp_path, request) -> Iterator:
    """mount(uri, name) -> a started MountedDaemon of `uri`; all stopped at teardown."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATASET_", "AZURE_STORAGE", "AZUREML_", "RSLEX_"))
    }
    # no credentials of any kind: a synthetic source must not look for them
    env["DATASET_MOUNT_CACHE_DIR"] = str(tmp_path / "cache")
    env.update(worker_processes_env())
    mounts: list[MountedDaemon] = []

    def mount(uri: str, name: str) -> MountedDaemon:
        daemon = MountedDaemon(uri, tmp_path / name, env, tmp_path / f"{name}.log")
        mounts.append(daemon)
        return daemon.start()

    yield mount
    failed = request.node.rep_call.failed if hasattr(request.node, "rep_call") else False
    for daemon in mounts:
        daemon.stop()
        if failed:
            print(f"--- daemon log {daemon.log_file} ---\n{daemon.log()[-20000:]}")


def test_every_name_and_byte_is_the_datasets(synthetic_mount) -> None:
    root = synthetic_mount(URI, "mnt").mountpoint
    assert sorted(os.listdir(root)) == ["large", "small"]
    assert sorted(os.listdir(root / "small")) == ["d0000", "d0001", "d0002"]
    listed = sorted(
        f"{os.path.relpath(folder, root)}/{name}"
        for folder, _, files in os.walk(root)
        for name in files
    )
    assert listed == sorted(DATASET.name(i) for i in range(DATASET.files))
    assert os.stat(root / DATASET.name(7)).st_size == 25_000
    large = DATASET.name(DATASET.small_files)
    assert os.stat(root / large).st_size == 20 * MiB

    # every small file, by several readers at once, as a data loader reads them
    small = [DATASET.name(i) for i in range(DATASET.small_files)]
    random.Random(1).shuffle(small)
    assert wrong_files(root, DATASET, small, readers=8) == []

    # the large file whole, in 1 MiB reads, then a few reads at odd offsets
    fd = os.open(root / large, os.O_RDONLY)
    try:
        for offset in range(0, 20 * MiB, MiB):
            assert os.pread(fd, MiB, offset) == expected_bytes(DATASET, large, offset, MiB)
        for offset, length in ((1, 4095), (3 * MiB - 7, 2 * MiB + 11), (20 * MiB - 5, 100)):
            got = os.pread(fd, length, offset)
            assert got == expected_bytes(DATASET, large, offset, length)
        assert os.pread(fd, 10, 20 * MiB) == b""
    finally:
        os.close(fd)


def test_a_prefix_mounts_one_folder(synthetic_mount) -> None:
    query = URI.partition("?")[2]
    root = synthetic_mount(f"synthetic://bench/small/d0001?{query}", "folder").mountpoint
    names = sorted(os.listdir(root))
    assert names == [f"f{i:07d}.bin" for i in range(100, 200)]
    name = names[42]
    assert read_whole(root / name) == expected_bytes(
        DATASET, f"small/d0001/{name}", 0, DATASET.small_size
    )
