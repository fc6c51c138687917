"""Cutting a ranged answer into blocks as its chunks arrive."""

from __future__ import annotations

import random

import pytest

from blobmount.storage.body_parts import PartCutter, split_parts

BODY = bytes(random.Random(7).randbytes(1000))


def cut(chunks: list[bytes], skip: int, lengths: list[int]) -> tuple[list[bytes], int]:
    cutter = PartCutter(skip, lengths)
    for chunk in chunks:
        cutter.feed(chunk)
    return cutter.finish(), cutter.body_bytes


def chunked(data: bytes, sizes: list[int]) -> list[bytes]:
    out, at = [], 0
    for size in sizes:
        out.append(data[at : at + size])
        at += size
    if at < len(data):
        out.append(data[at:])
    return out


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("skip", [0, 1, 99, 300])
def test_parts_are_the_right_bytes_whatever_the_chunk_boundaries(seed, skip):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 200) for _ in range(rng.randint(1, 4))]
    chunks = chunked(BODY, [rng.randint(1, 150) for _ in range(rng.randint(0, 12))])
    parts, seen = cut(chunks, skip, lengths)
    assert seen == len(BODY)
    at = skip
    for part, length in zip(parts, lengths, strict=True):
        assert part == BODY[at : at + length]
        at += length


def test_a_body_that_ends_first_gives_fewer_and_shorter_parts():
    parts, seen = cut([BODY[:250]], 0, [100, 100, 100, 100])
    assert [len(p) for p in parts] == [100, 100, 50]
    assert b"".join(parts) == BODY[:250]
    assert seen == 250


def test_bytes_past_the_parts_are_counted_not_kept():
    parts, seen = cut(chunked(BODY, [10, 500]), 5, [20])
    assert parts == [BODY[5:25]]
    assert seen == len(BODY)


def test_a_chunk_that_is_exactly_a_part_is_kept_without_a_copy():
    first, second = BODY[:100], BODY[100:300]
    parts, _ = cut([first, second], 0, [100, 200])
    assert parts[0] is first
    assert parts[1] is second


def test_split_parts_slices_a_whole_answer():
    assert split_parts(BODY[:30], [10, 10, 10]) == [BODY[:10], BODY[10:20], BODY[20:30]]
    assert split_parts(BODY[:15], [10, 10]) == [BODY[:10], BODY[10:15]]
    assert split_parts(b"", [10]) == []


@pytest.mark.parametrize(("skip", "lengths"), [(-1, [1]), (0, []), (0, [5, 0])])
def test_nonsense_is_refused(skip, lengths):
    with pytest.raises(ValueError):
        PartCutter(skip, lengths)
