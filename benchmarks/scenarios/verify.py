"""The result buffer, and checking a run against the generated source after the clock stops.

Mount readers read straight into one pre-faulted result buffer (`os.preadv`, no copy a normal
reader would not do); the ceiling keeps the bytes objects the client returned. Only after the
clock stops is every read compared with the generated source (memcmp of `bytes`, in runs of up to
64 MiB), so checking costs the timed part nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from scenarios.plans import MountPlan, RangeGet


def new_buffer(size: int) -> bytearray:
    """A zeroed result buffer with every page already faulted in (outside the timed part: on
    this VM first-touch page faults cost about 1 s per GiB). Zeroed, so a read that never
    happened cannot pass verification."""
    return bytearray(1) * size


#: contiguous reads are compared in runs of up to this many bytes
_VERIFY_RUN = 64 * 1024 * 1024


def _same(got: memoryview | bytes, source: bytes, offset: int) -> bool:
    # bytes == bytes is one memcmp; memoryview == memoryview compares item by item (~100x slower)
    want = source[offset : offset + len(got)]
    return (got if isinstance(got, bytes) else bytes(got)) == want


def verify_mount_reads(
    plan: MountPlan, buf: bytearray, source: Callable[[str], bytes]
) -> str | None:
    """None if every read of the plan put the right bytes at its dest, else where it did not."""
    view = memoryview(buf)
    for job in plan.jobs:
        content = source(job.blob)
        run_off = run_dest = run_len = 0
        for r in (*job.reads, None):
            # merge reads that are contiguous both in the file and in the buffer
            if (
                r is not None
                and run_len
                and r.offset == run_off + run_len
                and r.dest == run_dest + run_len
                and run_len < _VERIFY_RUN
            ):
                run_len += r.length
                continue
            if run_len and not _same(view[run_dest : run_dest + run_len], content, run_off):
                return f"{job.blob}, somewhere in bytes {run_off}-{run_off + run_len - 1}"
            if r is not None:
                run_off, run_dest, run_len = r.offset, r.dest, r.length
    return None


def verify_gets(pieces: list[tuple[RangeGet, bytes]], source: Callable[[str], bytes]) -> str | None:
    """None if every GET returned exactly the bytes of its range, else the first that did not."""
    for get, data in pieces:
        if len(data) != get.length or not _same(data, source(get.blob), get.offset):
            return f"{get.blob}, GET of bytes {get.offset}-{get.offset + get.length - 1}"
    return None


def listing_mismatch(name: str, found: set[str], want: frozenset[str]) -> str | None:
    """None if a listing found exactly the expected files, else what differed."""
    missing, extra = sorted(want - found), sorted(found - want)
    if not missing and not extra:
        return None
    return (
        f"{name}: {len(missing)} file(s) missing {missing[:3]}, {len(extra)} unexpected {extra[:3]}"
    )
