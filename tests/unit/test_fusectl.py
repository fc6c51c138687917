"""Raising a FUSE mount's background-request limit, on a fake mountinfo and fusectl directory
(the real ones: tests/e2e/test_mount_options.py)."""

from __future__ import annotations

import logging

import pytest

from blobmount import fusectl
from blobmount.daemon import tune_kernel_background_requests

MOUNTINFO = (
    "37 25 0:33 / /mnt/data rw - fuse.blobmount az ro\n"
    "39 25 0:41 / /mnt/data rw - fuse.blobmount az ro\n"  # mounted over the first
)


@pytest.fixture
def fake(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    root = tmp_path / "connections"
    for conn in ("33", "41"):
        (root / conn).mkdir(parents=True)
        (root / conn / "max_background").write_text("12\n")
        (root / conn / "congestion_threshold").write_text("9\n")
    return str(info), root


def test_the_top_mounts_connection_gets_the_limit_and_three_quarters_as_threshold(fake):
    info, root = fake
    assert fusectl.set_max_background("/mnt/data", 64, mountinfo=info, root=str(root)) == "41"
    assert (root / "41" / "max_background").read_text() == "64"
    assert (root / "41" / "congestion_threshold").read_text() == "48"
    assert (root / "33" / "max_background").read_text() == "12\n"  # covered: untouched
    assert fusectl.set_max_background("/mnt/data", 1, mountinfo=info, root=str(root)) == "41"
    assert (root / "41" / "congestion_threshold").read_text() == "1"


def test_nothing_mounted_or_no_fusectl_is_an_error(fake, tmp_path):
    info, root = fake
    with pytest.raises(LookupError):
        fusectl.set_max_background("/mnt/none", 64, mountinfo=info, root=str(root))
    with pytest.raises(OSError):
        fusectl.set_max_background("/mnt/data", 64, mountinfo=info, root=str(tmp_path / "no"))


def test_fusectl_already_there_is_not_mounted_again(fake, monkeypatch):
    _, root = fake
    monkeypatch.setattr(fusectl.subprocess, "run", lambda *a, **k: pytest.fail("ran mount"))
    assert fusectl.ensure_fusectl(str(root)) is False


def test_a_failed_fusectl_mount_is_an_os_error(tmp_path, monkeypatch):
    empty = tmp_path / "connections"
    empty.mkdir()

    class Done:
        returncode = 32
        stderr = "mount: only root can do that\n"

    monkeypatch.setattr(fusectl.subprocess, "run", lambda *a, **k: Done())
    with pytest.raises(OSError, match="only root can do that"):
        fusectl.ensure_fusectl(str(empty))


def test_a_refused_limit_is_logged_not_fatal(caplog, monkeypatch, tmp_path):
    monkeypatch.setattr(fusectl, "FUSECTL_ROOT", str(tmp_path / "missing"))
    with caplog.at_level(logging.INFO, logger="blobmount.daemon"):
        tune_kernel_background_requests("/no/such/mount/point", 64)
    assert "FUSE background requests not raised to 64" in caplog.text
    caplog.clear()
    tune_kernel_background_requests("/no/such/mount/point", 0)  # 0: leave the kernel alone
    assert caplog.text == ""
