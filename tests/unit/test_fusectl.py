"""Raising a FUSE mount's background-request limit, on a fake mountinfo and fusectl directory
(the real ones: tests/e2e/test_mount_options.py)."""

from __future__ import annotations

import logging

import pytest

from blobmount import fusectl
from blobmount.daemon import tune_kernel_background_requests
from tests.helpers.fake_sysfs import fake_kernel_files

MOUNTINFO = (
    "37 25 0:33 / /mnt/data rw - fuse.blobmount az ro\n"
    "39 25 0:41 / /mnt/data rw - fuse.blobmount az ro\n"  # mounted over the first
)


@pytest.fixture
def fake(tmp_path):
    limits = {"max_background": "12\n", "congestion_threshold": "9\n"}
    return fake_kernel_files(tmp_path, MOUNTINFO, "connections", {"33": limits, "41": limits})


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


def test_fusectl_in_the_mount_table_is_not_mounted_again(tmp_path, monkeypatch):
    info = tmp_path / "mountinfo"
    info.write_text("21 20 0:40 / /sys/fs/fuse/connections rw - fusectl fusectl rw\n")
    monkeypatch.setattr(fusectl.subprocess, "run", lambda *a, **k: pytest.fail("ran mount"))
    assert fusectl.ensure_fusectl("/sys/fs/fuse/connections", mountinfo=str(info)) is False


def test_missing_fusectl_is_mounted_and_a_failure_is_an_os_error(tmp_path, monkeypatch):
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)  # FUSE mounts, no fusectl
    ran: list[list[str]] = []

    class Done:
        returncode = 0
        stderr = ""

    def run(cmd, **kwargs):
        ran.append(cmd)
        return Done()

    monkeypatch.setattr(fusectl.subprocess, "run", run)
    assert fusectl.ensure_fusectl("/c", mountinfo=str(info)) is True
    assert ran == [["mount", "-t", "fusectl", "fusectl", "/c"]]
    Done.returncode, Done.stderr = 32, "mount: only root can do that\n"
    with pytest.raises(OSError, match="only root can do that"):
        fusectl.ensure_fusectl("/c", mountinfo=str(info))


def test_a_refused_limit_is_logged_not_fatal(caplog, monkeypatch, tmp_path):
    monkeypatch.setattr(fusectl, "FUSECTL_ROOT", str(tmp_path / "missing"))
    monkeypatch.setattr(fusectl.subprocess, "run", lambda *a, **k: pytest.fail("ran mount"))
    monkeypatch.setattr(fusectl, "ensure_fusectl", lambda: False)
    with caplog.at_level(logging.INFO, logger="blobmount.daemon"):
        tune_kernel_background_requests("/no/such/mount/point", 64)
    assert "FUSE background requests not raised to 64" in caplog.text
    caplog.clear()
    tune_kernel_background_requests("/no/such/mount/point", 0)  # 0: leave the kernel alone
    assert caplog.text == ""
