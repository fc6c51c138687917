"""Human-friendly sizes and booleans, as written in environment variables and flags. Pure.

Every size suffix is BINARY, whatever its spelling: ``1K`` = ``1KB`` = ``1KiB`` = 1024 bytes and
``1MB`` = 1048576 bytes. This is how the Azure ML mount reads its ``DATASET_MOUNT_*`` sizes, and a
setting copied from an Azure ML job must mean the same bytes here.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB

# Exponent of 1024 for each unit letter.
_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4}

_SIZE_RE = re.compile(
    r"""
    (?P<sign>[+-]?)
    (?P<number>\d+(?:\.\d*)?|\.\d+)
    \s*
    (?:(?P<unit>[kmgt])i?)?   # K, Ki, M, Mi, ...
    b?                        # optional trailing B: KB, KiB, or a bare B for bytes
    """,
    re.IGNORECASE | re.VERBOSE,
)

_SIZE_HELP = (
    "expected a number of bytes with an optional unit K/KB/KiB, M/MB/MiB, G/GB/GiB or T/TB/TiB "
    "(binary: 1 KB = 1024 bytes), e.g. '2MB' or '1.5 GiB'"
)

# No PiB: parse_size has no P suffix, and format_size output must read back.
_FORMAT_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def parse_size(text: str, *, allow_negative: bool = False) -> int:
    """Parse a size such as ``"4096"``, ``"512KB"``, ``"2 MiB"`` or ``"1.5g"`` into bytes.

    Case-insensitive; a space between number and unit is allowed. Decimals are allowed with a
    unit, and the result is rounded toward zero to whole bytes; without a unit the number must be
    a whole number of bytes. A leading ``-`` is accepted only with ``allow_negative``.

    Raises:
        ValueError: the text is not a size, or is negative when that is not allowed.
    """
    stripped = text.strip()
    match = _SIZE_RE.fullmatch(stripped)
    if match is None:
        raise ValueError(f"{text!r} is not a size: {_SIZE_HELP}")
    try:
        number = Fraction(Decimal(match["number"]))
    except InvalidOperation:  # the regex should make this unreachable; keep the message helpful
        raise ValueError(f"{text!r} is not a size: {_SIZE_HELP}") from None
    unit = match["unit"]
    if unit is None:
        if number.denominator != 1:
            raise ValueError(f"{text!r} is not a whole number of bytes: {_SIZE_HELP}")
        value = int(number)
    else:
        value = int(number * 1024 ** _POWERS[unit.lower()])  # int() rounds toward zero
    if match["sign"] == "-":
        if value and not allow_negative:
            raise ValueError(f"{text!r} is negative; a size here must be 0 or more")
        value = -value
    return value


def format_size(n: int) -> str:
    """Format a byte count for people: ``"0 B"``, ``"512 B"``, ``"2 MiB"``, ``"1.5 GiB"``.

    Uses the largest binary unit not above the value, with at most two decimals, so the text is
    approximate for odd sizes (``parse_size`` reads it back exactly when it is not).
    """
    if n < 0:
        return "-" + format_size(-n)
    index = 0
    while index + 1 < len(_FORMAT_UNITS) and n >= 1024 ** (index + 1):
        index += 1
    if index == 0:
        return f"{n} B"
    value = round(n / 1024**index, 2)
    # 1048575 bytes rounds to 1024.0 KiB: say 1 MiB instead.
    if value >= 1024 and index + 1 < len(_FORMAT_UNITS):
        index += 1
        value = round(n / 1024**index, 2)
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{text} {_FORMAT_UNITS[index]}"


def parse_bool(text: str) -> bool:
    """Parse true/false, 1/0, yes/no, on/off (case-insensitive, surrounding spaces ignored).

    Raises:
        ValueError: anything else.
    """
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"{text!r} is not a boolean: expected true/false, 1/0, yes/no or on/off")
