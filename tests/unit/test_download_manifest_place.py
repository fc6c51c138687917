"""Where a download keeps its manifest: outside DEST, one file per source and destination, and
a manifest an older version left inside DEST moved out so its download still resumes."""

from __future__ import annotations

from pathlib import Path

from blobmount.compose.download import download_config, downloads_state_dir
from blobmount.download_mode.manifest import MANIFEST_NAME, Manifest, Record, manifest_path
from blobmount.settings import load_settings
from blobmount.source import parse_source


def rec(path: str) -> Record:
    return Record(path, f"acct/c/{path}", 10, '"e1"', 1700000000.5, 1700000000500000000, False)


def test_one_manifest_per_source_and_destination(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    one = manifest_path(folder, "az://c/train", tmp_path / "dest")
    assert one.parent == folder
    assert one.name.startswith(str(tmp_path / "dest").strip("/").replace("/", "_")[-60:])
    assert one == manifest_path(folder, "az://c/train", tmp_path / "dest")
    others = {
        manifest_path(folder, "az://c/val", tmp_path / "dest"),
        manifest_path(folder, "az://c/train", tmp_path / "other"),
    }
    assert one not in others
    assert len(others) == 2


def test_a_manifest_kept_elsewhere_leaves_dest_untouched(tmp_path: Path) -> None:
    dest, db = tmp_path / "dest", tmp_path / "state" / "downloads" / "x.db"
    dest.mkdir()
    m = Manifest.open(dest, db)
    m.save([rec("a")])
    m.close()
    assert list(dest.iterdir()) == []
    assert Manifest.open(dest, db).lookup(["a"]) == {"a": rec("a")}


def test_an_older_manifest_inside_dest_is_moved_out(tmp_path: Path) -> None:
    dest, db = tmp_path / "dest", tmp_path / "state" / "x.db"
    dest.mkdir()
    old = Manifest.open(dest)  # where versions before 0.2 kept it
    old.save([rec("a")])
    old.close()
    assert (dest / MANIFEST_NAME).is_file()

    m = Manifest.open(dest, db)
    assert m.lookup(["a"]) == {"a": rec("a")}  # the download resumes from it
    m.close()
    assert list(dest.iterdir()) == []


def test_an_older_manifest_beside_a_newer_one_is_removed(tmp_path: Path) -> None:
    dest, db = tmp_path / "dest", tmp_path / "x.db"
    dest.mkdir()
    newer = Manifest.open(dest, db)
    newer.save([rec("new")])
    newer.close()
    older = Manifest.open(dest)
    older.save([rec("old")])
    older.close()
    m = Manifest.open(dest, db)
    assert set(m.lookup(["new", "old"])) == {"new"}
    m.close()
    assert list(dest.iterdir()) == []


def test_the_cli_and_the_api_keep_it_in_the_state_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    spec = parse_source("az://cont/train")
    config = download_config(load_settings({}), spec, tmp_path / "dest")
    assert downloads_state_dir() == tmp_path / "state" / "blobmount" / "downloads"
    assert config.manifest_path == manifest_path(
        downloads_state_dir(), spec.display, tmp_path / "dest"
    )
