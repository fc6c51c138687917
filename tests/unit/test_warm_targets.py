"""`blobmount warm` PATHs: resolved against the mount, refused outside it, walked in order."""

from __future__ import annotations

import os

import pytest

from blobmount.warm.targets import WarmPathError, check_targets, resolve_targets, walk


@pytest.fixture
def root(tmp_path) -> str:
    """A tree standing in for a mount: a/1.bin, a/b/2.bin, a/b/c/3.bin, z.bin, empty/."""
    mnt = tmp_path / "mnt"
    for rel, size in (("a/1.bin", 10), ("a/b/2.bin", 20), ("a/b/c/3.bin", 30), ("z.bin", 5)):
        (mnt / rel).parent.mkdir(parents=True, exist_ok=True)
        (mnt / rel).write_bytes(b"x" * size)
    (mnt / "empty").mkdir()
    return str(mnt)


def test_no_path_means_the_whole_mount(root):
    assert resolve_targets(root, []) == [root]


def test_relative_paths_are_relative_to_the_mount_not_the_working_folder(
    root, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert resolve_targets(root, ["a/b", "z.bin"]) == [f"{root}/a/b", f"{root}/z.bin"]


def test_absolute_paths_inside_the_mount_are_kept(root):
    assert resolve_targets(root, [f"{root}/a/./b/"]) == [f"{root}/a/b"]


@pytest.mark.parametrize(
    "path",
    ["/etc", "..", "../mnt2", "a/../../x", "/", "{root}2", "{root}2/a"],
)
def test_a_path_outside_the_mount_is_refused(root, path):
    with pytest.raises(WarmPathError, match="is outside the mount"):
        resolve_targets(root, [path.format(root=root)])


def test_dotdot_that_stays_inside_is_fine(root):
    assert resolve_targets(root, ["a/b/../1.bin"]) == [f"{root}/a/1.bin"]


def test_a_symlink_into_the_mount_counts_as_inside(root, tmp_path):
    link = tmp_path / "data"
    link.symlink_to(root)
    assert resolve_targets(root, [f"{link}/a/b"]) == [f"{root}/a/b"]


def test_an_empty_path_is_refused(root):
    with pytest.raises(WarmPathError, match="empty"):
        resolve_targets(root, [""])


def test_paths_inside_other_paths_and_repeats_are_dropped(root):
    got = resolve_targets(root, ["a/b/c", "a", "z.bin", "a/b", "z.bin"])
    assert got == [f"{root}/a", f"{root}/z.bin"]
    assert resolve_targets(root, ["a", "."]) == [root]


def test_check_names_a_missing_path(root):
    with pytest.raises(WarmPathError, match=r"a/nope: no such file or folder"):
        check_targets(root, [f"{root}/a", f"{root}/a/nope"])


def test_check_refuses_what_is_neither_file_nor_folder(root):
    fifo = f"{root}/pipe"
    os.mkfifo(fifo)
    with pytest.raises(WarmPathError, match="neither a file nor a folder"):
        check_targets(root, [fifo])


def test_walk_yields_files_in_a_stable_order_with_sizes(root):
    errors: list[tuple[str, OSError]] = []
    files = list(walk(root, resolve_targets(root, []), lambda rel, exc: errors.append((rel, exc))))
    # a folder's files first, then its subfolders, by name
    assert [(f.rel, f.size) for f in files] == [
        ("z.bin", 5),
        ("a/1.bin", 10),
        ("a/b/2.bin", 20),
        ("a/b/c/3.bin", 30),
    ]
    assert all(f.path == os.path.join(root, f.rel) for f in files)
    assert errors == []


def test_walk_of_a_file_and_a_folder(root):
    targets = resolve_targets(root, ["z.bin", "a/b"])
    assert [f.rel for f in walk(root, targets, lambda rel, exc: None)] == [
        "a/b/2.bin",
        "a/b/c/3.bin",
        "z.bin",
    ]


def test_walk_reports_what_vanished_and_goes_on(root):
    targets = resolve_targets(root, ["a/b/c", "z.bin"])
    os.remove(f"{root}/a/b/c/3.bin")
    os.rmdir(f"{root}/a/b/c")
    errors: list[str] = []
    files = list(walk(root, targets, lambda rel, exc: errors.append(rel)))
    assert [f.rel for f in files] == ["z.bin"]
    assert errors == ["a/b/c"]
