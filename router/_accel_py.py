"""Pure-Python versions of the router's per-block hot loops (the C ones are `_accel.c`).

`router.accel` uses these when the C extension was not built or `WARMGATE_NATIVE=python`
is set. Same arguments, results (bit for bit) and errors (the classes of `router.errors`)
as the C module; types in `_accel.pyi`. The block table is a plain dict here (the C
module's is a `BlockMap`).
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterable
from itertools import groupby, repeat
from typing import TYPE_CHECKING

import xxhash

from router.errors import AccelArgumentTypeError, BlockSizeError

if TYPE_CHECKING:
    from typing_extensions import Buffer

IMPLEMENTATION = "python"

_U64 = 1 << 64


def hash_blocks(data: Buffer, seed: int, block_chars: int, /) -> list[int]:
    """Chained xxh3-64 hashes of every full `block_chars`-byte block of `data`:
    h_i = xxh3_64(block_i, seed=h_{i-1}) from h_{-1} = seed."""
    if not isinstance(seed, int):
        raise AccelArgumentTypeError(f"seed must be an int, not {type(seed).__name__}")
    if not isinstance(block_chars, int):
        raise AccelArgumentTypeError(
            f"block_chars must be an int, not {type(block_chars).__name__}"
        )
    if not 0 <= seed < _U64:  # xxhash would wrap it silently; the C module cannot
        raise OverflowError("seed must fit in an unsigned 64-bit int")
    if block_chars > sys.maxsize:
        raise OverflowError("block_chars is too large")
    if block_chars <= 0:
        raise BlockSizeError("block_chars must be positive")
    view = memoryview(data).cast("B")  # TypeError for str and other non-buffers
    full = len(view) // block_chars
    digest = xxhash.xxh3_64_intdigest
    hashes: list[int] = []
    append = hashes.append
    h = seed
    # struct.iter_unpack cuts the blocks in C; the loop only chains and hashes
    for (chunk,) in struct.iter_unpack(f"{block_chars}s", view[: full * block_chars]):
        h = digest(chunk, h)
        append(h)
    return hashes


def new_block_map() -> dict[int, int]:
    """The prefix index's block table: a plain dict (the C module returns a BlockMap)."""
    return {}


def lookup_runs(blocks: dict[int, int], hashes: Iterable[int], /) -> list[tuple[int, int]]:
    """`blocks[h]` for each `h` of `hashes` in order, as runs `(value, length)` of equal
    consecutive values, up to the first `h` that is missing or maps to 0."""
    if not isinstance(blocks, dict):
        raise AccelArgumentTypeError(f"blocks must be a dict, not {type(blocks).__name__}")
    runs: list[tuple[int, int]] = []
    # lookups and grouping run in C (map, groupby); a miss reads as 0 and ends the walk
    for v, group in groupby(map(blocks.get, hashes, repeat(0))):
        if not v:
            break
        runs.append((v, sum(1 for _ in group)))
    return runs
