"""How much of a block chain a store holds, and where: the pure half of `TieredStore.lookup`.

A chain is usable only as a prefix (the engine loads leading blocks), so every count here is
of the leading run: the tiers of the blocks up to the first one held nowhere, and per tier
the run held in that tier alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tierd.tiers.l2_array import ArrayDir


def probe_array(array: ArrayDir, hashes: list[int], known: list[bool]) -> list[int]:
    """The unknown hashes whose array files exist, up to the first that does not (blocking:
    stats files; run in a worker thread)."""
    found: list[int] = []
    for h, k in zip(hashes, known, strict=True):
        if k:
            continue
        if not array.exists(h):
            break
        found.append(h)
    return found


def leading_run(hashes: list[int], has: Callable[[int], bool]) -> int:
    n = 0
    for h in hashes:
        if not has(h):
            break
        n += 1
    return n


def chain_summary(
    hashes: list[int],
    where: Callable[[int], str | None],
    held_in: Mapping[str, Callable[[int], bool]],
) -> dict[str, Any]:
    """`lookup`'s answer: blocks, the leading available run and its tiers, per-tier runs."""
    tiers: list[str] = []
    for h in hashes:
        t = where(h)
        if t is None:
            break
        tiers.append(t)
    return {
        "blocks": len(hashes),
        "available": len(tiers),
        "tiers": tiers,
        "leading": {t: leading_run(hashes, has) for t, has in held_in.items()},
        "counts": {t: tiers.count(t) for t in held_in},
    }
