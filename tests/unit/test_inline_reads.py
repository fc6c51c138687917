"""The gate that lets small disk-tier blocks be read on the trio thread while the disk is fast."""

from __future__ import annotations

from blobmount.blocks.inline_reads import InlineReadGate


def gate() -> InlineReadGate:
    return InlineReadGate(max_bytes=1000, slow_s=0.002, first_backoff_s=1.0, max_backoff_s=4.0)


def test_only_small_blocks_of_known_size_are_read_in_place():
    g = gate()
    assert g.allows(1, now=0.0)
    assert g.allows(1000, now=0.0)
    assert not g.allows(1001, now=0.0)
    assert not g.allows(None, now=0.0)


def test_fast_reads_keep_reads_in_place():
    g = gate()
    for t in range(100):
        g.record(0.0001, now=float(t))
        assert g.allows(10, now=float(t))
    assert (g.statistics().reads, g.statistics().slow_reads) == (100, 0)


def test_a_slow_read_backs_off_and_the_back_off_doubles_up_to_its_cap():
    g = gate()
    g.record(0.01, now=10.0)
    assert not g.allows(10, now=10.5)
    assert g.allows(10, now=11.0)  # 1 s later: a probe
    g.record(0.01, now=11.0)  # still slow: 2 s
    assert not g.allows(10, now=12.9)
    assert g.allows(10, now=13.0)
    g.record(0.01, now=13.0)  # 4 s
    assert not g.allows(10, now=16.9)
    g.record(0.01, now=17.0)  # capped at 4 s
    assert not g.allows(10, now=20.9)
    assert g.allows(10, now=21.0)
    assert g.statistics().slow_reads == 4


def test_a_fast_probe_resets_the_back_off():
    g = gate()
    g.record(0.01, now=0.0)
    g.record(0.01, now=1.0)  # back-off now 4 s next time
    g.record(0.0001, now=3.0)  # fast: back to 1 s
    g.record(0.01, now=3.0)
    assert not g.allows(10, now=3.9)
    assert g.allows(10, now=4.0)
