"""A real FUSE mount of Azurite, read with ordinary tools: bytes, tree, errors, concurrency."""

from __future__ import annotations

import errno
import hashlib
import io
import mmap
import multiprocessing
import os
import random
import sqlite3
import subprocess
import tarfile
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from blobmount.testing.pattern import pattern_bytes, pattern_sha256
from tests.helpers.sqlite_db import sqlite_bytes

pytestmark = [pytest.mark.fuse, pytest.mark.azurite]

MiB = 1024 * 1024
SIZES = {
    "empty": 0,
    "one": 1,
    "page_minus": 4095,
    "block_minus": 2 * MiB - 1,
    "block": 2 * MiB,
    "block_plus": 2 * MiB + 1,
    "large": 100 * MiB + 12345,
}


def _tar_bytes() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(20):
            data = pattern_bytes(f"tar{i}", 0, 1000 + i * 5000)
            info = tarfile.TarInfo(f"sample/{i:03d}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def dataset(azurite, tmp_path_factory):
    """One container for the module: sizes, nesting, markers, awkward names."""
    container = f"basics-{uuid.uuid4().hex[:8]}"
    azurite.create_container(container)
    expected: dict[str, str] = {}
    items = []
    for name, size in SIZES.items():
        items.append((f"sizes/{name}.bin", pattern_bytes(name, 0, size)))
        expected[f"sizes/{name}.bin"] = pattern_sha256(name, size)
    for path in (
        "deep/a/b/c/d/leaf.txt",
        "deep/a/sibling.txt",
        "with space/file name.txt",
        "ünïcødé/naïve 文件.txt",
        "top.txt",
    ):
        data = f"content of {path}\n".encode()
        items.append((path, data))
        expected[path] = hashlib.sha256(data).hexdigest()
    tar = _tar_bytes()
    items.append(("archives/shard.tar", tar))
    expected["archives/shard.tar"] = hashlib.sha256(tar).hexdigest()
    db = sqlite_bytes(
        tmp_path_factory.mktemp("db"), 20000, lambda i: f"value-{i}" * 20, index=False
    )
    items.append(("db/data.sqlite", db))
    expected["db/data.sqlite"] = hashlib.sha256(db).hexdigest()
    azurite.upload_many(container, items)
    azurite.upload_folder_marker(container, "empty-folder")
    return container, expected


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1024 * 1024):
            h.update(chunk)
    return h.hexdigest()


def test_every_file_reads_back_exactly(dataset, mount_factory):
    container, expected = dataset
    mnt = mount_factory(container).mountpoint
    for name, digest in expected.items():
        assert sha256_file(mnt / name) == digest, name
    for name, size in SIZES.items():
        assert os.path.getsize(mnt / f"sizes/{name}.bin") == size


def test_tree_has_folders_markers_and_odd_names(dataset, mount_factory):
    container, expected = dataset
    mnt = mount_factory(container).mountpoint
    files = set()
    dirs = set()
    for root, dirnames, filenames in os.walk(mnt):
        rel = os.path.relpath(root, mnt)
        for d in dirnames:
            dirs.add(os.path.normpath(os.path.join(rel, d)))
        for f in filenames:
            files.add(os.path.normpath(os.path.join(rel, f)))
    assert files == set(expected)
    assert {"deep/a/b/c/d", "with space", "ünïcødé", "empty-folder", "sizes"} <= dirs
    assert os.listdir(mnt / "empty-folder") == []
    st = os.stat(mnt / "top.txt")
    assert st.st_mode & 0o777 == 0o444
    assert os.stat(mnt / "deep").st_mode & 0o777 == 0o555
    # ordinary tools agree
    out = subprocess.run(
        ["find", str(mnt), "-type", "f"], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert len([line for line in out if line]) == len(expected)


def test_write_type_operations_get_erofs(dataset, mount_factory):
    container, _ = dataset
    mnt = mount_factory(container).mountpoint
    attempts = {
        "write": lambda: open(mnt / "top.txt", "r+b"),
        "append": lambda: open(mnt / "top.txt", "ab"),
        "create": lambda: open(mnt / "new.txt", "wb"),
        "unlink": lambda: os.unlink(mnt / "top.txt"),
        "mkdir": lambda: os.mkdir(mnt / "newdir"),
        "rmdir": lambda: os.rmdir(mnt / "empty-folder"),
        "rename": lambda: os.rename(mnt / "top.txt", mnt / "moved.txt"),
        "truncate": lambda: os.truncate(mnt / "top.txt", 0),
        "chmod": lambda: os.chmod(mnt / "top.txt", 0o777),
        "symlink": lambda: os.symlink("top.txt", mnt / "link"),
        "utime": lambda: os.utime(mnt / "top.txt", (0, 0)),
    }
    for what, attempt in attempts.items():
        with pytest.raises(OSError) as info:
            attempt()
        assert info.value.errno == errno.EROFS, what
    assert sha256_file(mnt / "top.txt") == dataset[1]["top.txt"]


def test_missing_paths_get_enoent(dataset, mount_factory):
    container, _ = dataset
    mnt = mount_factory(container).mountpoint
    for path in ("nope", "deep/nope", "deep/a/b/c/d/leaf.txt/below"):
        with pytest.raises(OSError) as info:
            os.stat(mnt / path)
        assert info.value.errno in (errno.ENOENT, errno.ENOTDIR), path
    with pytest.raises(FileNotFoundError):
        open(mnt / "sizes/nope.bin", "rb")


def test_concurrent_threads_read_right_bytes(dataset, mount_factory):
    container, _ = dataset
    mnt = mount_factory(container).mountpoint
    size = SIZES["large"]
    rng = random.Random(7)
    ranges = [(rng.randrange(size), rng.randrange(1, 3 * MiB)) for _ in range(200)]

    def check(r):
        off, length = r
        with open(mnt / "sizes/large.bin", "rb") as f:
            f.seek(off)
            got = f.read(length)
        return got == pattern_bytes("large", off, min(length, size - off))

    with ThreadPoolExecutor(16) as pool:
        assert all(pool.map(check, ranges))


def _sha_of(path: str) -> str:
    return sha256_file(path)


def test_concurrent_processes_read_right_bytes(dataset, mount_factory):
    container, expected = dataset
    mnt = mount_factory(container).mountpoint
    names = ["sizes/large.bin", "sizes/block_plus.bin", "archives/shard.tar", "top.txt"] * 2
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        digests = pool.map(_sha_of, [str(mnt / n) for n in names])
    assert digests == [expected[n] for n in names]


def test_mmap_reads_right(dataset, mount_factory):
    container, _ = dataset
    mnt = mount_factory(container).mountpoint
    size = SIZES["block_plus"]
    with (
        open(mnt / "sizes/block_plus.bin", "rb") as f,
        mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m,
    ):
        assert len(m) == size
        assert m[:100] == pattern_bytes("block_plus", 0, 100)
        assert m[size - 5000 :] == pattern_bytes("block_plus", size - 5000, 5000)
        assert hashlib.sha256(m).hexdigest() == pattern_sha256("block_plus", size)


def test_tarfile_and_sqlite_work_on_the_mount(dataset, mount_factory):
    container, _ = dataset
    mnt = mount_factory(container).mountpoint
    with tarfile.open(mnt / "archives/shard.tar") as tar:
        members = tar.getmembers()
        assert len(members) == 20
        for i, member in enumerate(members):
            data = tar.extractfile(member).read()
            assert data == pattern_bytes(f"tar{i}", 0, 1000 + i * 5000)
    con = sqlite3.connect(f"file:{mnt / 'db/data.sqlite'}?mode=ro&immutable=1", uri=True)
    assert con.execute("select count(*), sum(id) from t").fetchone() == (20000, 199990000)
    assert con.execute("select v from t where id = 12345").fetchone()[0] == "value-12345" * 20
    con.close()


def test_scandir_streams_entries(dataset, mount_factory):
    container, expected = dataset
    mnt = mount_factory(container).mountpoint
    with os.scandir(mnt / "sizes") as it:
        names = sorted(e.name for e in it if e.is_file())
    assert names == sorted(f"{n}.bin" for n in SIZES)


def test_mount_of_a_prefix(dataset, mount_factory):
    container, expected = dataset
    mnt = mount_factory(container, prefix="deep/a").mountpoint
    assert sorted(os.listdir(mnt)) == ["b", "sibling.txt"]
    assert sha256_file(mnt / "b/c/d/leaf.txt") == expected["deep/a/b/c/d/leaf.txt"]
