"""The memory the daemon may use (RAM or cgroup limit) and the automatic read-ahead cap."""

from __future__ import annotations

from blobmount.compose.configs import read_ahead_budget
from blobmount.memory_limit import cgroup_limit_bytes, usable_memory_bytes
from blobmount.settings import load_settings
from tests.helpers.cgroup import fake_cgroup

MiB = 1024 * 1024
GiB = 1024 * MiB


def test_cgroup_v2_limit_of_the_process_group(tmp_path):
    proc, root = fake_cgroup(
        tmp_path, "0::/pod/sidecar\n", {"pod/sidecar/memory.max": "2147483648"}
    )
    assert cgroup_limit_bytes(proc, root) == 2 * GiB


def test_cgroup_v2_max_means_no_limit(tmp_path):
    proc, root = fake_cgroup(tmp_path, "0::/\n", {"memory.max": "max"})
    assert cgroup_limit_bytes(proc, root) is None


def test_cgroup_v1_limit_and_its_no_limit_value(tmp_path):
    proc, root = fake_cgroup(
        tmp_path,
        "5:cpu,cpuacct:/x\n4:memory:/job\n",
        {"memory/job/memory.limit_in_bytes": str(3 * GiB)},
    )
    assert cgroup_limit_bytes(proc, root) == 3 * GiB
    proc, root = fake_cgroup(
        tmp_path / "b", "4:memory:/\n", {"memory/memory.limit_in_bytes": "9223372036854771712"}
    )
    assert cgroup_limit_bytes(proc, root) is None


def test_unreadable_cgroup_files_mean_no_limit(tmp_path):
    assert cgroup_limit_bytes(tmp_path / "missing", tmp_path) is None
    proc, root = fake_cgroup(tmp_path, "0::/a\n", {"a/memory.max": "garbage"})
    assert cgroup_limit_bytes(proc, root) is None


def test_this_machine_has_some_memory():
    assert (usable_memory_bytes() or 0) > 64 * MiB


def test_automatic_read_ahead_cap_scales_with_memory_between_two_and_eight_windows():
    settings = load_settings({})  # 32 blocks of 2 MiB: a 64 MiB window
    window = 64 * MiB
    assert read_ahead_budget(settings, None) == 2 * window  # memory unknown: the floor
    assert read_ahead_budget(settings, 1 * GiB) == 2 * window  # a small sidecar: the floor
    assert read_ahead_budget(settings, 4 * GiB) == 4 * window  # 1/16 of it
    assert read_ahead_budget(settings, 24 * GiB) == 8 * window  # a GPU node: the cap


def test_a_read_ahead_limit_that_is_set_is_used_as_it_is():
    settings = load_settings({"DATASET_MOUNT_READ_AHEAD_MEMORY_LIMIT": "32MB"})
    assert read_ahead_budget(settings, 24 * GiB) == 32 * MiB  # sizes are binary, as in Azure ML
    zero = load_settings({"DATASET_MOUNT_READ_AHEAD_MEMORY_LIMIT": "0"})
    assert read_ahead_budget(zero, 24 * GiB) == 0
