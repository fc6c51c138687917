"""The SQLite manifest: round trip, batching, reopening, and a corrupt file."""

from __future__ import annotations

from blobmount.download_mode.manifest import MANIFEST_NAME, Manifest, Record


def rec(path: str, etag: str = '"e1"', verified: bool = False) -> Record:
    return Record(path, f"acct/c/{path}", 10, etag, 1700000000.5, 1700000000500000000, verified)


def test_save_and_lookup_round_trip(tmp_path):
    m = Manifest.open(tmp_path)
    assert m.lookup(["a", "b"]) == {}
    assert m.save([rec("a"), rec("b/c", verified=True)]) == 2
    assert m.lookup(["a", "b/c", "missing"]) == {"a": rec("a"), "b/c": rec("b/c", verified=True)}
    m.save([rec("a", etag='"e2"')])  # replaces
    assert m.lookup(["a"])["a"].etag == '"e2"'
    assert m.save([]) == 0
    m.close()


def test_records_survive_reopening(tmp_path):
    m = Manifest.open(tmp_path)
    m.save([rec(f"f{i}") for i in range(2000)])
    m.close()
    m = Manifest.open(tmp_path)
    assert m.count() == 2000
    # more paths than one SQL statement may carry
    found = m.lookup([f"f{i}" for i in range(0, 2000, 1)])
    assert len(found) == 2000
    m.close()


def test_a_corrupt_manifest_is_moved_aside_and_restarted(tmp_path, caplog):
    (tmp_path / MANIFEST_NAME).write_bytes(b"this is not a database" * 100)
    m = Manifest.open(tmp_path)
    assert m.count() == 0
    m.save([rec("a")])
    m.close()
    assert (tmp_path / (MANIFEST_NAME + ".corrupt")).exists()
    assert "unreadable" in caplog.text
