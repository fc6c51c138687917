"""The mount table parser and the kernel read-ahead knob, on a fake mountinfo and sysfs (the real
ones are exercised by every e2e mount: the daemon logs what it set)."""

from __future__ import annotations

import logging

import pytest

from blobmount.daemon import tune_kernel_read_ahead
from blobmount.mounttable import blobmount_mounts, mounts, set_read_ahead
from tests.helpers.fake_sysfs import fake_kernel_files

MOUNTINFO = (
    "36 25 0:32 / /mnt/with\\040space rw,nosuid - fuse.blobmount az ro\n"
    "37 25 0:33 / /mnt/other rw - fuse.sshfs host: rw\n"
    "38 25 0:34 / /mnt/with\\040space/inner rw - fuse.blobmount az ro\n"
    "39 25 0:35 / /mnt/other rw - fuse.blobmount az ro\n"  # mounted over /mnt/other
    "garbage line\n"
)


@pytest.fixture
def fake(tmp_path):
    read_ahead = {"read_ahead_kb": "128\n"}
    return fake_kernel_files(tmp_path, MOUNTINFO, "bdi", {"0:33": read_ahead, "0:35": read_ahead})


def test_mounts_in_order_with_escapes(fake):
    info, _ = fake
    entries = mounts(info)
    assert [(m.device, m.mountpoint, m.fstype) for m in entries] == [
        ("0:32", "/mnt/with space", "fuse.blobmount"),
        ("0:33", "/mnt/other", "fuse.sshfs"),
        ("0:34", "/mnt/with space/inner", "fuse.blobmount"),
        ("0:35", "/mnt/other", "fuse.blobmount"),
    ]
    assert blobmount_mounts(info) == ["/mnt/with space/inner", "/mnt/with space", "/mnt/other"]
    assert mounts(str(fake[1] / "missing")) == []


def test_read_ahead_goes_to_the_top_mount_at_the_point(fake):
    info, bdi = fake
    assert set_read_ahead("/mnt/other", 1024 * 1024, mountinfo=info, bdi_root=str(bdi)) == "0:35"
    assert (bdi / "0:35" / "read_ahead_kb").read_text() == "1024"
    assert (bdi / "0:33" / "read_ahead_kb").read_text() == "128\n"  # the covered mount: untouched
    with pytest.raises(LookupError):
        set_read_ahead("/mnt/none", 1024, mountinfo=info, bdi_root=str(bdi))
    with pytest.raises(OSError):
        set_read_ahead("/mnt/with space", 1024, mountinfo=info, bdi_root=str(bdi))  # no sysfs dir


def test_a_refused_read_ahead_is_logged_not_fatal(caplog):
    with caplog.at_level(logging.INFO, logger="blobmount.daemon"):
        tune_kernel_read_ahead("/no/such/mount/point", 1024 * 1024)
    assert "kernel read-ahead not raised to 1 MiB" in caplog.text
    caplog.clear()
    tune_kernel_read_ahead("/no/such/mount/point", 0)  # 0: leave the kernel's default alone
    assert caplog.text == ""
