"""The CPUs the daemon may use (affinity, cgroup quota), and DATASET_MOUNT_WORKER_PROCESSES=auto."""

from __future__ import annotations

import os

import pytest

from blobmount import cpu_limit
from blobmount.cpu_limit import affinity_cpus, cgroup_cpus
from blobmount.errors import ConfigError
from blobmount.settings import load_settings
from tests.helpers.cgroup import fake_cgroup


def test_cgroup_v2_quota_of_the_process_group_rounds_up(tmp_path):
    proc, root = fake_cgroup(
        tmp_path, "0::/pod/sidecar\n", {"pod/sidecar/cpu.max": "150000 100000", "cpu.max": "max"}
    )
    assert cgroup_cpus(proc, root) == 2  # 1.5 CPUs: two processes can use them, one cannot


def test_cgroup_v2_the_tightest_quota_and_max_for_none(tmp_path):
    proc, root = fake_cgroup(
        tmp_path,
        "0::/pod/c\n",
        {"pod/c/cpu.max": "800000 100000", "cpu.max": "400000 100000"},
    )
    assert cgroup_cpus(proc, root) == 4
    proc, root = fake_cgroup(tmp_path / "none", "0::/\n", {"cpu.max": "max 100000"})
    assert cgroup_cpus(proc, root) is None


def test_cgroup_v1_quota_and_its_no_quota_value(tmp_path):
    files = {
        "cpu/kube/pod/cpu.cfs_quota_us": "300000",
        "cpu/kube/pod/cpu.cfs_period_us": "100000",
        "cpu/cpu.cfs_quota_us": "-1",
        "cpu/cpu.cfs_period_us": "100000",
    }
    proc, root = fake_cgroup(tmp_path, "5:cpu,cpuacct:/kube/pod\n4:memory:/kube/pod\n", files)
    assert cgroup_cpus(proc, root) == 3
    proc, root = fake_cgroup(tmp_path / "free", "5:cpu,cpuacct:/\n", dict.fromkeys(files, "-1"))
    assert cgroup_cpus(proc, root) is None


def test_nothing_readable_is_no_quota(tmp_path):
    assert cgroup_cpus(tmp_path / "missing", tmp_path) is None
    proc, root = fake_cgroup(tmp_path, "0::/x\n", {"x/cpu.max": "garbage"})
    assert cgroup_cpus(proc, root) is None


def test_affinity_is_this_process_mask():
    assert affinity_cpus() == len(os.sched_getaffinity(0))


def test_auto_takes_the_usable_cpus_at_most_16(monkeypatch):
    monkeypatch.setattr(cpu_limit, "cgroup_cpus", lambda: 3)
    monkeypatch.setattr(cpu_limit, "affinity_cpus", lambda: 8)
    assert load_settings({"DATASET_MOUNT_WORKER_PROCESSES": "auto"}).worker_processes == 3
    monkeypatch.setattr(cpu_limit, "cgroup_cpus", lambda: None)
    assert load_settings({"DATASET_MOUNT_WORKER_PROCESSES": " AUTO "}).worker_processes == 8
    monkeypatch.setattr(cpu_limit, "affinity_cpus", lambda: 96)
    assert load_settings({"DATASET_MOUNT_WORKER_PROCESSES": "auto"}).worker_processes == 16


def test_a_bad_value_names_auto_among_what_is_allowed():
    with pytest.raises(ConfigError) as info:
        load_settings({"DATASET_MOUNT_WORKER_PROCESSES": "many"})
    assert str(info.value) == (
        "DATASET_MOUNT_WORKER_PROCESSES='many' is not valid: expected a number of processes "
        'between 1 and 16, or "auto" (the CPUs this process may use)'
    )
