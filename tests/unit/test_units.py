"""Sizes and booleans as written in settings: parse_size, format_size, parse_bool."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blobmount.units import GiB, KiB, MiB, TiB, format_size, parse_bool, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("4096", 4096),
        ("  4096  ", 4096),
        ("100B", 100),
        ("100 b", 100),
        ("1K", KiB),
        ("1KB", KiB),
        ("1KiB", KiB),
        ("1ki", KiB),
        ("512kb", 512 * KiB),
        ("2M", 2 * MiB),
        ("2MB", 2 * MiB),
        ("2 MiB", 2 * MiB),
        ("2mib", 2 * MiB),
        ("150 MB", 150 * MiB),
        ("3G", 3 * GiB),
        ("3gb", 3 * GiB),
        ("3GiB", 3 * GiB),
        ("1T", TiB),
        ("1TB", TiB),
        ("1 TiB", TiB),
        ("1.5GB", 3 * GiB // 2),
        ("0.5k", 512),
        (".5K", 512),
        ("1.KB", KiB),
        ("1.0", 1),
        ("+7MB", 7 * MiB),
        ("-0", 0),
    ],
)
def test_parse_size_accepts(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_parse_size_suffixes_are_binary() -> None:
    # The Azure ML mount reads MB as 2**20; so must we.
    assert parse_size("1MB") == 1_048_576
    assert parse_size("1GB") == 1_073_741_824


def test_parse_size_rounds_fractional_bytes_toward_zero() -> None:
    assert parse_size("0.1KB") == 102  # 102.4 bytes


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "abc",
        "MB",
        "1.5",
        "1,5MB",
        "1e3",
        "1 PB",
        "1MBB",
        "1 M B",
        "10 bytes",
        "--1",
        "0x10",
    ],
)
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"size|whole number of bytes"):
        parse_size(text)


def test_parse_size_error_explains_the_units() -> None:
    with pytest.raises(ValueError, match=r"'abc'.*KB.*1 KB = 1024 bytes"):
        parse_size("abc")


def test_parse_size_negative_only_when_allowed() -> None:
    with pytest.raises(ValueError, match="negative"):
        parse_size("-5GB")
    assert parse_size("-5GB", allow_negative=True) == -5 * GiB
    assert parse_size("-1.5 MiB", allow_negative=True) == -(3 * MiB // 2)


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (64 * KiB, "64 KiB"),
        (2 * MiB, "2 MiB"),
        (150 * MiB, "150 MiB"),
        (3 * GiB // 2, "1.5 GiB"),
        (5 * TiB, "5 TiB"),
        (MiB - 1, "1 MiB"),  # rounds up to the next unit, not "1024 KiB"
        (123_456_789, "117.74 MiB"),
        (-5 * GiB, "-5 GiB"),
    ],
)
def test_format_size(n: int, expected: str) -> None:
    assert format_size(n) == expected


@pytest.mark.parametrize("n", [0, 512, KiB, 1536, 2 * MiB, 150 * MiB, 3 * GiB // 2, 5 * TiB])
def test_format_size_reads_back_exactly_for_round_values(n: int) -> None:
    assert parse_size(format_size(n)) == n


@given(st.integers(min_value=-(2**50), max_value=2**50))
def test_format_size_reads_back_within_rounding(n: int) -> None:
    # Two decimals of a unit >= 1, read back truncated to whole bytes: within 1% of the value.
    back = parse_size(format_size(n), allow_negative=True)
    assert abs(back - n) <= abs(n) * 0.01


@pytest.mark.parametrize("text", ["true", "TRUE", " yes ", "1", "on", "On"])
def test_parse_bool_true(text: str) -> None:
    assert parse_bool(text) is True


@pytest.mark.parametrize("text", ["false", "False", "no", "0", "off", " OFF"])
def test_parse_bool_false(text: str) -> None:
    assert parse_bool(text) is False


@pytest.mark.parametrize("text", ["", "2", "y", "enabled", "truthy", "-1"])
def test_parse_bool_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a boolean"):
        parse_bool(text)
