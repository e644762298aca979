"""Types of the router's accelerated hot loops: the C extension `router._accel` and its
pure-Python twin `router._accel_py` (see `router.accel`)."""

from collections.abc import Iterable, Iterator
from typing import Final, Literal, TypeVar, final, overload

from typing_extensions import Buffer

_T = TypeVar("_T")

IMPLEMENTATION: Final[Literal["c", "python"]]

def hash_blocks(data: Buffer, seed: int, block_chars: int, /) -> list[int]:
    """Chained xxh3-64 hashes of every full `block_chars`-byte block of `data`:
    h_i = xxh3_64(block_i, seed=h_{i-1}) from h_{-1} = seed. TypeError for a non-buffer
    (`router.errors.AccelArgumentTypeError`, a TypeError, for a non-int argument),
    OverflowError for a seed outside [0, 2**64), `router.errors.BlockSizeError` (a
    ValueError) for block_chars <= 0."""

@final
class BlockMap:
    """u64 key -> int value, a dict stand-in for the prefix index's block table (C only):
    open addressing in one flat array, so a lookup costs one cache miss, and `lookup_runs`
    prefetches along a chain. Keys outside [0, 2**64) raise OverflowError, non-int keys and
    values `router.errors.AccelArgumentTypeError`, a TypeError (a dict would take them, or
    read them as a miss). `items()` is an iterator that raises RuntimeError if entries come
    or go under it. Not GC-tracked (its values are ints)."""

    def __init__(self) -> None: ...
    def __len__(self) -> int: ...
    def __getitem__(self, key: int, /) -> int: ...
    def __setitem__(self, key: int, value: int, /) -> None: ...
    def __delitem__(self, key: int, /) -> None: ...
    def __contains__(self, key: int, /) -> bool: ...
    @overload
    def get(self, key: int, /) -> int | None: ...
    @overload
    def get(self, key: int, default: int, /) -> int: ...
    @overload
    def get(self, key: int, default: _T, /) -> int | _T: ...
    @overload
    def pop(self, key: int, /) -> int: ...
    @overload
    def pop(self, key: int, default: int, /) -> int: ...
    @overload
    def pop(self, key: int, default: _T, /) -> int | _T: ...
    def items(self) -> Iterator[tuple[int, int]]: ...
    def _slot(self, key: int, /) -> int:
        """For tests: the index of the slot holding `key`, else -1."""

def new_block_map() -> BlockMap | dict[int, int]:
    """An empty block table: a `BlockMap` from the C module, a dict from the Python one."""

def lookup_runs(
    blocks: BlockMap | dict[int, int], hashes: Iterable[int], /
) -> list[tuple[int, int]]:
    """`blocks[h]` for each `h` of `hashes` in order, as runs `(value, length)` of equal
    consecutive values, up to the first `h` that is missing or maps to 0. `blocks`: a
    BlockMap (C only; its walk prefetches) or a dict."""
