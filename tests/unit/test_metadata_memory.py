"""Memory bound (issue #8): cached metadata for 1,000,000 folder entries, listed the way the
kernel lists with readdirplus (each entry both in its folder's listing and a looked-up inode),
costs under 300 bytes each in the process's RSS.

Runs benchmarks/metadata_memory.py in a fresh interpreter, so nothing else this test session
allocated is counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "metadata_memory.py"
ENTRIES = 1_000_000
BOUND = 300


@pytest.mark.timeout(600)
def test_a_million_cached_entries_cost_under_300_bytes_each():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--entries", str(ENTRIES), "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result = json.loads(out)
    print(f"metadata: {result['rss_bytes_per_entry']:.0f} bytes per entry (RSS)")
    assert result["inodes"] >= ENTRIES  # every entry became a node
    assert result["rss_bytes_per_entry"] < BOUND
