"""The gate that lets small disk-tier blocks be read on the trio thread while the disk is fast."""

from __future__ import annotations

from blobmount.blocks.inline_reads import InlineReadGate


def gate() -> InlineReadGate:
    return InlineReadGate(
        max_bytes=1000, slow_s=0.002, stall_s=0.02, first_backoff_s=1.0, max_backoff_s=4.0
    )


FAST = 0.00003
SEEK = 0.008  # a disk that seeks: slow on average, never a stall
STALL = 0.05


def test_only_small_blocks_of_known_size_are_read_in_place():
    g = gate()
    assert g.allows(1, now=0.0)
    assert g.allows(1000, now=0.0)
    assert not g.allows(1001, now=0.0)
    assert not g.allows(None, now=0.0)


def test_fast_reads_keep_reads_in_place():
    g = gate()
    for t in range(100):
        g.record(FAST, now=float(t))
        assert g.allows(10, now=float(t))
    assert (g.statistics().reads, g.statistics().slow_reads) == (100, 0)


def test_occasional_gil_waits_do_not_send_reads_to_threads():
    # a read that waited for the GIL: a few ms now and then, even a few in a row
    g = gate()
    for t in range(1000):
        g.record(0.004 if t % 50 < 3 else FAST, now=t / 1000)
        assert g.allows(10, now=t / 1000)
    assert g.statistics().slow_reads == 0


def test_a_disk_slow_on_every_read_backs_off_within_three_reads():
    g = gate()
    g.record(SEEK, now=0.0)
    g.record(SEEK, now=0.0)
    assert g.allows(10, now=0.0)
    g.record(SEEK, now=0.0)
    assert not g.allows(10, now=0.5)
    assert g.allows(10, now=1.0)
    assert g.statistics().slow_reads == 1


def test_one_stall_backs_off_at_once():
    g = gate()
    g.record(FAST, now=0.0)
    g.record(STALL, now=0.0)
    assert not g.allows(10, now=0.9)
    assert g.allows(10, now=1.0)


def test_the_back_off_doubles_up_to_its_cap_while_probes_stay_slow():
    g = gate()
    g.record(STALL, now=10.0)
    assert not g.allows(10, now=10.5)
    assert g.allows(10, now=11.0)  # 1 s later: a probe
    g.record(STALL, now=11.0)  # still slow: 2 s
    assert not g.allows(10, now=12.9)
    assert g.allows(10, now=13.0)
    g.record(STALL, now=13.0)  # 4 s
    assert not g.allows(10, now=16.9)
    g.record(STALL, now=17.0)  # capped at 4 s
    assert not g.allows(10, now=20.9)
    assert g.allows(10, now=21.0)
    assert g.statistics().slow_reads == 4


def test_a_seeking_disk_keeps_doubling_the_back_off():
    # its probes are never fast, so the back-off is not reset between spells
    g = gate()
    for _ in range(3):
        g.record(SEEK, now=0.0)
    for _ in range(3):
        g.record(SEEK, now=1.0)
    assert not g.allows(10, now=2.9)
    assert g.allows(10, now=3.0)


def test_a_fast_probe_resets_the_back_off():
    g = gate()
    g.record(STALL, now=0.0)
    g.record(STALL, now=1.0)  # back-off now 4 s next time
    g.record(FAST, now=3.0)  # fast: back to 1 s
    g.record(STALL, now=3.0)
    assert not g.allows(10, now=3.9)
    assert g.allows(10, now=4.0)
