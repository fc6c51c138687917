import pytest

from blobmount.blocks.keys import block_count, block_span, blocks_covering

B = 2 * 1024 * 1024


@pytest.mark.parametrize(
    ("size", "count"), [(0, 0), (1, 1), (B - 1, 1), (B, 1), (B + 1, 2), (10 * B + 5, 11)]
)
def test_block_count(size, count):
    assert block_count(size, B) == count


def test_block_span_last_partial_block():
    size = 2 * B + 7
    assert block_span(0, B, size) == (0, B)
    assert block_span(2, B, size) == (2 * B, 7)
    assert block_span(3, B, size) == (3 * B, 0)


@pytest.mark.parametrize(
    ("offset", "length", "expected"),
    [
        (0, 1, range(0, 1)),
        (1, 1, range(0, 1)),
        (B - 1, 1, range(0, 1)),
        (B - 1, 2, range(0, 2)),
        (B, 1, range(1, 2)),
        (B + 1, B, range(1, 3)),
        (0, 10 * B, range(0, 3)),  # clipped to the blob
        (3 * B, 10, range(0)),  # past the end
        (5, 0, range(0)),
    ],
)
def test_blocks_covering(offset, length, expected):
    assert blocks_covering(offset, length, B, 2 * B + 7) == expected
