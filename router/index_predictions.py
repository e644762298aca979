"""The prefix index's predictions, per instance: batches of predict-on-route insertions (their
expiry and hashes in chain order, unboxed) and which batch owns each predicted block.
`router.index.PrefixIndex` keeps one `Predictions` per instance (see its docstring).

A batch is a plain tuple `(seq, expiry, packed hashes)` holding only atoms (int, float,
bytes), so the cyclic garbage collector stops tracking it the first time it looks at it: a
full collection never walks the batches, however many a TTL keeps alive. (As an object with
an array it was two tracked objects a routed request: at 450 requests/s and a 600 s TTL,
270k batches made a full collection of the gateway's heap take 84 ms instead of 1 ms.)
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from router import accel

if TYPE_CHECKING:
    from router._accel import BlockMap

# hashes as unboxed u64s (8 bytes each) when they all fit, else a tuple of ints
Packed = bytes | tuple[int, ...]
Batch = tuple[int, float, Packed]  # (seq, expiry, hashes in chain order)


def pack(hashes: Iterable[int]) -> Packed:
    values = list(hashes)
    try:
        return array("Q", values).tobytes()
    except OverflowError:
        return tuple(values)


def unpack(packed: Packed) -> Sequence[int]:
    return memoryview(packed).cast("Q") if isinstance(packed, bytes) else packed


def count(packed: Packed) -> int:
    return len(packed) // 8 if isinstance(packed, bytes) else len(packed)


class Predictions:
    """The TTL'd, capacity-bounded predictions of one instance."""

    __slots__ = ("batches", "owner", "refs")

    def __init__(self) -> None:
        # hash -> number of the batch that predicted it last (a BlockMap like the table:
        # a u64 key in a slot instead of an int object per predicted block)
        self.owner: BlockMap | dict[int, int] = accel.new_block_map()
        self.batches: deque[Batch] = deque()
        self.refs = 0  # total length of the batches' hash lists (live + stale)
