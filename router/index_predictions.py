"""The prefix index's predictions, per instance: batches of predict-on-route insertions (their
expiry and hashes in chain order, unboxed) and which batch owns each predicted block.
`router.index.PrefixIndex` keeps one `Predictions` per instance (see its docstring)."""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable, MutableSequence
from typing import TYPE_CHECKING

from router import accel

if TYPE_CHECKING:
    from router._accel import BlockMap


class Batch:
    """One predict-on-route insertion: its expiry and its hashes in chain order."""

    __slots__ = ("expiry", "hashes", "seq")

    def __init__(self, seq: int, expiry: float, hashes: Iterable[int]) -> None:
        self.seq = seq
        self.expiry = expiry
        self.hashes = compact_list(hashes)


def compact_list(hashes: Iterable[int]) -> MutableSequence[int]:
    """Hashes as unboxed u64s when they fit (8 bytes each, invisible to the cyclic GC),
    else a plain list."""
    values = list(hashes)
    try:
        return array("Q", values)
    except OverflowError:
        return values


class Predictions:
    """The TTL'd, capacity-bounded predictions of one instance."""

    __slots__ = ("batches", "owner", "refs")

    def __init__(self) -> None:
        # hash -> number of the batch that predicted it last (a BlockMap like the table:
        # a u64 key in a slot instead of an int object per predicted block)
        self.owner: BlockMap | dict[int, int] = accel.new_block_map()
        self.batches: deque[Batch] = deque()
        self.refs = 0  # total length of the batches' hash lists (live + stale)
