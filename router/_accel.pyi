"""Types of the router's accelerated hot loops: the C extension `router._accel` and its
pure-Python twin `router._accel_py` (see `router.accel`)."""

from collections.abc import Iterable
from typing import Final, Literal

from typing_extensions import Buffer

IMPLEMENTATION: Final[Literal["c", "python"]]

def hash_blocks(data: Buffer, seed: int, block_chars: int, /) -> list[int]:
    """Chained xxh3-64 hashes of every full `block_chars`-byte block of `data`:
    h_i = xxh3_64(block_i, seed=h_{i-1}) from h_{-1} = seed. TypeError for a non-buffer or a
    non-int argument, OverflowError for a seed outside [0, 2**64), ValueError for
    block_chars <= 0."""

def lookup_runs(blocks: dict[int, int], hashes: Iterable[int], /) -> list[tuple[int, int]]:
    """`blocks[h]` for each `h` of `hashes` in order, as runs `(value, length)` of equal
    consecutive values, up to the first `h` that is missing or maps to 0."""
