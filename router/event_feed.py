"""Feeding one publisher's KV events into the prefix index: sequencing and applying.

`SeqTracker` is a pure state machine over one publisher's sequence numbers: the first batch
is accepted as is, +1 is in order, a jump forward is a gap (batches were lost), a number at
or below the last one is a restart (a new publisher counts from 0 again). On a gap or a
restart the consumer drops what that publisher told it: `drop_publisher`, the one rule.

`apply_events` places each event by its medium (`contracts.tiers`: GPU -> the instance's
HBM, CPU -> its host memory, STORAGE/ARRAY -> the shared-array pseudo-instance, SNAPSHOT -> its
snapshots) and inserts, removes or clears. No I/O: the ZMQ consumer and the Redis stream
reader both call these.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from contracts.kv_events import AllBlocksCleared, BlockStored, KvEvent
from contracts.tiers import Tier, tier_of_medium
from router.index import ARRAY

# ---- sequencing -------------------------------------------------------------------------


class SeqStatus(enum.Enum):
    FIRST = "first"  # the first batch seen from this publisher
    IN_ORDER = "in_order"
    GAP = "gap"  # batches were lost: what we believe about the instance is stale
    RESTART = "restart"  # the publisher started over (seq went back)


@dataclass(frozen=True, slots=True)
class SeqVerdict:
    status: SeqStatus
    missed: int = 0  # batches lost (GAP only)

    @property
    def must_resync(self) -> bool:
        return self.status in (SeqStatus.GAP, SeqStatus.RESTART)


@dataclass(slots=True)
class SeqTracker:
    """One publisher's sequence: classify each batch and count gaps and restarts."""

    last: int | None = None
    gaps: int = 0
    missed: int = 0
    restarts: int = 0

    def observe(self, seq: int) -> SeqVerdict:
        last, self.last = self.last, seq
        if last is None:
            return SeqVerdict(SeqStatus.FIRST)
        if seq == last + 1:
            return SeqVerdict(SeqStatus.IN_ORDER)
        if seq > last + 1:
            self.gaps += 1
            self.missed += seq - last - 1
            return SeqVerdict(SeqStatus.GAP, missed=seq - last - 1)
        self.restarts += 1
        return SeqVerdict(SeqStatus.RESTART)

    def reset(self) -> None:
        self.last = None


# ---- applying events to an index ---------------------------------------------------------


class IndexSink(Protocol):
    """What `apply_events` needs of `router.index.PrefixIndex`."""

    def insert(self, instance: str, hashes: Sequence[int], tier: Tier) -> object: ...

    def remove(self, instance: str, hashes: Sequence[int], tier: Tier | None) -> object: ...

    def clear_instance(self, instance: str, tiers: Collection[Tier] | None = None) -> object: ...


def medium_target(
    instance: str, medium: str | None, array_id: str = ARRAY
) -> tuple[str, Tier] | None:
    """Where a medium's blocks live in the index (`contracts.tiers.tier_of_medium`): the
    instance's own tier, or for the shared array the array pseudo-instance. None (an unknown
    medium) means the event is skipped."""
    tier = tier_of_medium(medium)
    if tier is None:
        return None
    return (array_id if tier is Tier.ARRAY else instance), tier


def drop_publisher(
    index: IndexSink,
    instance: str,
    elsewhere: Mapping[tuple[str, Tier], Iterable[int]],
    tiers: Collection[Tier] | None = None,
) -> None:
    """The one resync rule, for both consumers (the gateway's ZMQ subscriber and the Redis
    stream reader): on a gap, a restart or an undecodable batch of one publisher, the index
    forgets everything it holds for that publisher's instance (event entries in every tier,
    and predictions: the lost batches may have removed what was predicted) and the blocks
    that publisher reported elsewhere (`elsewhere`: the shared array), nothing of anyone
    else. What follows (its next events, predict-on-route, an engine's replay where it has
    one) rebuilds it. `tiers`: the instance's tiers this publisher owns, when it is one of
    several (an engine and its tierd); None: all of them."""
    index.clear_instance(instance, tiers)
    for (where, tier), hashes in elsewhere.items():
        if where != instance:
            index.remove(where, list(hashes), tier)


def elsewhere_of(
    instance: str, events: Sequence[KvEvent], held: dict[int, None], array_id: str = ARRAY
) -> None:
    """Keep `held` (the blocks `instance`'s publisher placed in the shared array) up to
    date with its events: what `drop_publisher` must remove on a resync."""
    for event in events:
        if isinstance(event, AllBlocksCleared):
            continue  # clears the instance's own tiers, not the array
        target = medium_target(instance, event.medium, array_id)
        if target is None or target[0] == instance:
            continue
        if isinstance(event, BlockStored):
            held.update(dict.fromkeys(event.block_hashes))
        else:
            for h in event.block_hashes:
                held.pop(h, None)


@dataclass(slots=True)
class ApplyCounts:
    stored: int = 0  # blocks inserted
    removed: int = 0  # blocks removed
    cleared: int = 0  # AllBlocksCleared events
    unknown_medium: int = 0  # events skipped for a medium we cannot place
    by_tier: dict[Tier, int] = field(default_factory=dict)


def apply_events(
    index: IndexSink,
    instance: str,
    events: Sequence[KvEvent],
    array_id: str = ARRAY,
    tiers: Collection[Tier] | None = None,
) -> ApplyCounts:
    """Feed one publisher's events into the index, for `instance`; an AllBlocksCleared
    clears the instance's `tiers` (the ones this publisher owns; None: all)."""
    counts = ApplyCounts()
    for event in events:
        if isinstance(event, AllBlocksCleared):
            index.clear_instance(instance, tiers)
            counts.cleared += 1
            continue
        target = medium_target(instance, event.medium, array_id)
        if target is None:
            counts.unknown_medium += 1
            continue
        where, tier = target
        if isinstance(event, BlockStored):
            index.insert(where, list(event.block_hashes), tier)
            counts.stored += len(event.block_hashes)
            counts.by_tier[tier] = counts.by_tier.get(tier, 0) + len(event.block_hashes)
        else:
            index.remove(where, list(event.block_hashes), tier)
            counts.removed += len(event.block_hashes)
    return counts
