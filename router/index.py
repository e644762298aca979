"""The prefix index: which instance holds which block of a prompt's chain, and in which tier.

How it works, and why it is this shape (memory is bounded and measured, lookups are hot):

- One table maps `block_hash -> packed int`. Each instance (including the pseudo-instance
  `ARRAY`, the shared storage array) gets a small integer id and a field of `len(Tier) + 1`
  bits (5) in that int: one per `contracts.tiers.Tier`, at its value (bit 0 HBM (reported),
  bit 1 HOST, bit 2 ARRAY, bit 3 SNAPSHOT), then P (predicted HBM, from predict-on-route).
  Packed values repeat a lot, so they are interned (bounded): an entry costs a table slot,
  not an object per instance. The table is `accel.new_block_map()`: a
  C `BlockMap` (open addressing; a 16-byte slot holds the u64 key itself and the value
  pointer, at most 70% full) or, without the extension, a plain dict; both take the same
  calls (`get`, `[]=`, `pop`, `len`, `items`, `accel.lookup_runs`).
- Event-driven insertions (vLLM / tierd KV events) set the tier bits and never expire.
- Predict-on-route insertions set the P bit and are TTL'd and bounded per instance. Each
  call is one *batch* (one expiry, the hashes in chain order); a per-instance dict
  `hash -> batch number` says which batch owns a prediction, so re-predicting a chain
  refreshes it (numbers, not objects: int-only dicts are invisible to the cyclic GC, so a
  full collection never walks a million entries).
  Batches sit in a deque in insertion order, as tuples of atoms (their hashes packed as
  u64 bytes) that the GC stops tracking, so neither does a full collection walk them
  (`router.index_predictions`). Insertion order is (one TTL per index) also expiry
  order: expiry pops whole batches from the front. Over capacity, the least recently
  predicted batch loses blocks from its tail first, so what remains stays a prefix (like a
  radix tree evicting leaves). Stale references in old batches are skipped by the owner
  check and compacted away when they outnumber live ones.
- `match()` walks the chain once: one table lookup per block, up to the first block held
  nowhere, in one C call (`router.accel.lookup_runs`; a pure-Python fallback via map +
  groupby when the extension is not built or `WARMGATE_NATIVE=python`) that returns the runs
  of consecutive blocks with the same packed value. Each run is a segment, and the
  still-matching instances are a bit mask updated once per segment. Each instance's leading
  run is then the segments before its bit dropped, each counted at the best tier that
  instance can read it from (its own bits, else `Tier.ARRAY` when the shared array holds
  the block). No prefix-closure assumption is made, so a match is never longer than what
  was inserted (a binary search would save little: the scan is bound by memory latency on
  a large index). A dict lookup there misses the cache two or three times in a row (index
  table, entry, stored key object); a BlockMap lookup once, and its walk prefetches the
  slots 16 blocks ahead, on 2 MiB pages where the kernel grants them (fewer TLB misses).
  Measured on the 2-core dev VM, a million entries, a 511-block chain: with the caches
  flushed first, the walk takes ~55-70 us (dict: ~190-210) and `match()` ~170 us (dict:
  ~270-310); with the chain's slots cached, ~8-14 us and ~21-45 us (dict: ~16-90 and
  ~30-110, swinging with how much cache the VM's neighbours take).
- Costs: about 78 bytes per (block, instance) entry with predictions (`bench router`; 122
  with the prediction owners in dicts, 130 with dicts for both). The table is ~34 bytes per
  distinct block at a million; the owners keep their keys as u64s in BlockMaps too, so no
  int object per predicted block stays alive. `clear_instance` scans every entry (~0.1 s
  at a million), which only a publisher restart or a sequence gap asks for. Expiry assumes
  a non-decreasing clock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from contracts.errors import ConfigurationError, InputError
from contracts.tiers import Tier
from router import accel
from router.index_predictions import Batch, Predictions, count, pack, unpack

if TYPE_CHECKING:
    from router._accel import BlockMap

ARRAY = "__array__"  # pseudo-instance holding the blocks of the shared storage array

# An instance's field: one residency bit per tier, at the tier's value, then the predicted-HBM
# flag; the width follows `contracts.tiers.Tier`.
_TIER_BIT = {t: int(t) for t in Tier}
_PRED = len(Tier)  # bit offset of the predicted-HBM flag inside an instance's field
_WIDTH = _PRED + 1
_FIELD = (1 << _WIDTH) - 1
_ABOVE = (1 << (_WIDTH - 1)) - 1  # a field's bits above its lowest, shifted down by one
_INTERN_MAX = 1 << 16

DEFAULT_TTL_S = 300.0
DEFAULT_CAPACITY_BLOCKS = 1 << 20


def _best_tier(field: int) -> Tier | None:
    """The fastest tier a field holds the block in (a predicted HBM block counts as HBM)."""
    if field & (1 << _PRED):
        return Tier.HBM
    for tier in Tier:  # fastest first
        if field & (1 << _TIER_BIT[tier]):
            return tier
    return None


# best tier by (own field, whether the shared array holds the block)
_BEST: tuple[tuple[Tier | None, Tier | None], ...] = tuple(
    (
        _best_tier(f),
        min((t for t in (_best_tier(f), Tier.ARRAY) if t is not None), default=None),
    )
    for f in range(1 << _WIDTH)
)


class IndexParamsError(ConfigurationError, ValueError):
    """A PrefixIndex parameter out of range (`routing.index_ttl_s`, `index_capacity_blocks`)."""


class PredictionTierError(InputError, ValueError):
    """A predicted insert into a tier other than HBM (predictions are about HBM only)."""


class PrefixIndex:
    """`block_hash -> {instance: tier}` with TTL'd predictions and event-fed residency."""

    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s <= 0:
            raise IndexParamsError("ttl_s must be positive")
        if capacity_blocks <= 0:
            raise IndexParamsError("capacity_blocks must be positive")
        self.ttl_s = ttl_s
        self.capacity_blocks = capacity_blocks
        self._clock = clock
        # block hash -> packed value: a C BlockMap, or a dict without the extension
        self._blocks: BlockMap | dict[int, int] = accel.new_block_map()
        self._intern: dict[int, int] = {}
        self._ids: dict[str, int] = {}
        self._names: list[str] = []
        self._held: list[int] = []  # blocks held per instance id (any tier)
        self._preds: list[Predictions] = []
        self._entries = 0
        self._batch_seq = 0
        self._array_id = self._id(ARRAY)

    # -- instance ids -------------------------------------------------------------------

    def _id(self, instance: str) -> int:
        iid = self._ids.get(instance)
        if iid is None:
            iid = len(self._names)
            self._ids[instance] = iid
            self._names.append(instance)
            self._held.append(0)
            self._preds.append(Predictions())
        return iid

    def instances(self) -> list[str]:
        """Every instance the index has seen, `ARRAY` excluded."""
        return [n for n in self._names if n != ARRAY]

    # -- packed values ------------------------------------------------------------------

    def _store(self, h: int, value: int) -> None:
        if value:
            shared = self._intern.get(value)
            if shared is None:
                if len(self._intern) < _INTERN_MAX:
                    self._intern[value] = value
                shared = value
            self._blocks[h] = shared
        else:
            self._blocks.pop(h, None)

    def _set(self, iid: int, h: int, bits: int) -> None:
        shift = iid * _WIDTH
        old = self._blocks.get(h, 0)
        if not (old >> shift) & _FIELD:
            self._held[iid] += 1
            self._entries += 1
        new = old | (bits << shift)
        if new != old:
            self._store(h, new)

    def _clear(self, iid: int, h: int, bits: int) -> None:
        shift = iid * _WIDTH
        old = self._blocks.get(h)
        if old is None:
            return
        field = (old >> shift) & _FIELD
        if not field & bits:
            return
        new = old & ~(bits << shift)
        if not (new >> shift) & _FIELD:
            self._held[iid] -= 1
            self._entries -= 1
        self._store(h, new)

    # -- mutation -----------------------------------------------------------------------

    def insert(
        self,
        instance: str,
        hashes: Iterable[int],
        tier: Tier = Tier.HBM,
        now: float | None = None,
        *,
        predicted: bool = False,
    ) -> None:
        """Record that `instance` holds `hashes` in `tier`.

        `predicted=False` (KV events): kept until removed. `predicted=True` (predict-on-route,
        HBM only): expires `ttl_s` after `now` and counts against `capacity_blocks`.
        """
        iid = self._id(instance)
        if not predicted:
            bit = 1 << _TIER_BIT[tier]
            for h in hashes:
                self._set(iid, h, bit)
            return
        if tier != Tier.HBM:
            raise PredictionTierError("predictions are about HBM only")
        t = self._clock() if now is None else now
        preds = self._preds[iid]
        self._expire(iid, t)
        unique = dict.fromkeys(hashes)  # chain order, no repeats
        self._batch_seq += 1
        seq = self._batch_seq
        owner = preds.owner
        pbit = 1 << _PRED
        for h in unique:  # the caller's int objects become the keys (the batch keeps copies)
            owner[h] = seq
            self._set(iid, h, pbit)
        batch: Batch = (seq, t + self.ttl_s, pack(unique))
        preds.batches.append(batch)
        preds.refs += count(batch[2])
        self._evict_over_capacity(iid)
        if preds.refs > 2 * len(owner) + 1024:
            self._compact(iid)

    def remove(self, instance: str, hashes: Iterable[int], tier: Tier | None = None) -> None:
        """Forget `hashes` on `instance`: in `tier` only, or in every tier when None.
        Removing HBM also drops an HBM prediction (the engine said it is gone)."""
        iid = self._ids.get(instance)
        if iid is None:
            return
        bits = _FIELD if tier is None else 1 << _TIER_BIT[tier]
        if tier is None or tier == Tier.HBM:
            bits |= 1 << _PRED
        owner = self._preds[iid].owner
        for h in hashes:
            self._clear(iid, h, bits)
            if bits & (1 << _PRED):
                owner.pop(h, None)

    def clear_instance(self, instance: str, tiers: Collection[Tier] | None = None) -> None:
        """Forget everything about `instance` (publisher restart, sequence gap), or only its
        `tiers` (one publisher of several: an engine's own cache, its tierd's host memory and
        snapshots). Clearing HBM also drops its predictions. O(entries)."""
        iid = self._ids.get(instance)
        if iid is None:
            return
        shift = iid * _WIDTH
        bits = _FIELD if tiers is None else sum(1 << _TIER_BIT[t] for t in set(tiers))
        if tiers is None or Tier.HBM in tiers:
            bits |= 1 << _PRED
            self._preds[iid] = Predictions()
        mask = bits << shift
        touched = [(h, v) for h, v in self._blocks.items() if v & mask]  # then mutate
        for h, v in touched:
            new = v & ~mask
            if not (new >> shift) & _FIELD:
                self._held[iid] -= 1
                self._entries -= 1
            self._store(h, new)

    def expire(self, now: float | None = None) -> None:
        """Reclaim every expired prediction now (also done lazily on insert and match)."""
        t = self._clock() if now is None else now
        for iid in range(len(self._names)):
            self._expire(iid, t)

    def _drop_prediction(self, iid: int, h: int, seq: int) -> None:
        owner = self._preds[iid].owner
        if owner.get(h) == seq:
            del owner[h]
            self._clear(iid, h, 1 << _PRED)

    def _expire(self, iid: int, now: float) -> None:
        preds = self._preds[iid]
        batches = preds.batches
        while batches and batches[0][1] <= now:
            seq, _, packed = batches.popleft()
            preds.refs -= count(packed)
            for h in unpack(packed):
                self._drop_prediction(iid, h, seq)

    def _evict_over_capacity(self, iid: int) -> None:
        preds = self._preds[iid]
        batches = preds.batches
        while len(preds.owner) > self.capacity_blocks and batches:
            seq, expiry, packed = batches[0]
            hashes = list(unpack(packed))
            while hashes and len(preds.owner) > self.capacity_blocks:
                h = hashes.pop()  # from the tail: what remains stays a prefix
                preds.refs -= 1
                self._drop_prediction(iid, h, seq)
            if hashes:
                batches[0] = (seq, expiry, pack(hashes))
            else:
                batches.popleft()

    def _compact(self, iid: int) -> None:
        preds = self._preds[iid]
        owner = preds.owner
        kept: deque[Batch] = deque()
        refs = 0
        for seq, expiry, packed in preds.batches:
            live = [h for h in unpack(packed) if owner.get(h) == seq]
            if live:
                kept.append((seq, expiry, pack(live)))
                refs += len(live)
        preds.batches = kept
        preds.refs = refs

    # -- queries ------------------------------------------------------------------------

    def match(
        self, hashes: Sequence[int], instances: Sequence[str], now: float | None = None
    ) -> dict[str, dict[Tier, int]]:
        """Leading contiguous run of `hashes` per instance, counted by tier. Every requested
        instance gets an entry (empty when it holds nothing of the chain)."""
        result: dict[str, dict[Tier, int]] = {name: {} for name in instances}
        t = self._clock() if now is None else now
        ids: list[tuple[str, int]] = []
        alive = 0
        known = self._ids.get
        preds = self._preds
        for name in instances:
            iid = known(name)
            if iid is None:
                iid = self._id(name)  # an unseen instance still reads the shared array
            batches = preds[iid].batches
            if batches and batches[0][1] <= t:
                self._expire(iid, t)
            ids.append((name, iid))
            alive |= 1 << (iid * _WIDTH)
        self._expire(self._array_id, t)
        if not ids or not hashes:
            return result
        # presence of each instance's field, folded onto its lowest bit, for any field width:
        # a field's upper bits shifted down one, plus all ones there, carry into the field's
        # top bit exactly when one of them is set, and never into the next field
        low = alive
        rest = low * _ABOVE
        top = _WIDTH - 1
        array_field = _FIELD << (self._array_id * _WIDTH)
        segments: list[tuple[int, int, int]] = []  # (packed value, blocks, alive mask)
        # runs of equal consecutive packed values, up to the first block held nowhere
        for v, n in accel.lookup_runs(self._blocks, hashes):
            if not v & array_field:  # the shared array serves every instance
                alive &= (v | (((v >> 1) & rest) + rest) >> top) & low
            if not alive:
                break
            segments.append((v, n, alive))
        if not segments:
            return result
        ashift = self._array_id * _WIDTH
        first_alive = segments[0][2]
        for name, iid in ids:
            shift = iid * _WIDTH
            bit = 1 << shift
            if not first_alive & bit:
                continue
            counts = result[name]
            for v, n, seg_alive in segments:
                if not seg_alive & bit:
                    break
                in_array = 1 if (v >> ashift) & _FIELD else 0
                tier = _BEST[(v >> shift) & _FIELD][in_array]
                if tier is None:  # unreachable: alive implies present
                    break
                counts[tier] = counts.get(tier, 0) + n
        return result

    def blocks_held(self, instance: str) -> int:
        """Blocks the index believes `instance` holds, any tier, predictions included."""
        iid = self._ids.get(instance)
        return 0 if iid is None else self._held[iid]

    def predicted_held(self, instance: str) -> int:
        """Live (possibly not yet reclaimed) predictions for `instance`."""
        iid = self._ids.get(instance)
        return 0 if iid is None else len(self._preds[iid].owner)

    def __len__(self) -> int:
        """Entries: (block, instance) pairs, `ARRAY` counted as one instance."""
        return self._entries

    def distinct_blocks(self) -> int:
        return len(self._blocks)

    def stats(self) -> Mapping[str, object]:
        return {
            "entries": self._entries,
            "distinct_blocks": len(self._blocks),
            "blocks_by_instance": {n: self._held[i] for i, n in enumerate(self._names)},
            "predicted_by_instance": {
                n: len(self._preds[i].owner) for i, n in enumerate(self._names)
            },
        }
