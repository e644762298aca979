"""What the shared residency-event stream has said, per publisher, and its snapshot codec.

Every gateway replica reads the whole stream and applies each batch to its own in-memory
`PrefixIndex`. Alongside, `Residency` keeps a mirror of the stream's effect: for each
publishing source (the stream entry's `instance`), its sequence tracker and the blocks it
reported, grouped by where they live `(instance or the array pseudo-instance, tier)`.

The mirror serves two purposes:
- on a gap or a restart of one source, `router.event_feed.drop_publisher` (the rule both
  consumers follow) rather than trusting stale blocks;
- it encodes compactly as the pool's snapshot: msgpack
  `{"v": 1, "sources": [[source, last_seq, [[where, tier, <uint64 LE packed hashes>]...]]...]}`
  (8 bytes a block), so a new replica restores the index and the trackers from the snapshot
  and reads the stream from the ID it covers.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgpack

from contracts.kv_events import (
    AllBlocksCleared,
    BlockStored,
    EventBatch,
    MalformedEventError,
)
from contracts.tiers import Tier
from router.event_feed import (
    ApplyCounts,
    IndexSink,
    SeqTracker,
    SeqVerdict,
    apply_events,
    drop_publisher,
    medium_target,
)
from router.index import ARRAY

SNAPSHOT_VERSION = 1
Where = tuple[str, Tier]


@dataclass(slots=True)
class _Source:
    tracker: SeqTracker = field(default_factory=SeqTracker)
    blocks: dict[Where, dict[int, None]] = field(default_factory=dict)  # insertion-ordered sets


class Residency:
    def __init__(self, array_id: str = ARRAY) -> None:
        self.array_id = array_id
        self._sources: dict[str, _Source] = {}

    def sources(self) -> list[str]:
        return sorted(self._sources)

    def last_seq(self, source: str) -> int | None:
        src = self._sources.get(source)
        return None if src is None else src.tracker.last

    def blocks(self) -> int:
        return sum(len(h) for s in self._sources.values() for h in s.blocks.values())

    def held(self, source: str) -> dict[Where, list[int]]:
        src = self._sources.get(source)
        return {} if src is None else {w: list(h) for w, h in src.blocks.items() if h}

    def apply(
        self, source: str, seq: int, batch: EventBatch, index: IndexSink
    ) -> tuple[SeqVerdict, ApplyCounts]:
        """Track `seq`, drop the source's blocks on a gap or restart, then apply the batch."""
        src = self._sources.setdefault(source, _Source())
        verdict = src.tracker.observe(seq)
        if verdict.must_resync:
            self._drop(source, src, index)
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                for where in [w for w in src.blocks if w[0] == source]:
                    del src.blocks[where]
                continue
            target = medium_target(source, event.medium, self.array_id)
            if target is None:
                continue
            held = src.blocks.setdefault(target, {})
            if isinstance(event, BlockStored):
                held.update(dict.fromkeys(event.block_hashes))
            else:
                for h in event.block_hashes:
                    held.pop(h, None)
        counts = apply_events(index, source, batch.events, self.array_id)
        return verdict, counts

    def lost(self, source: str, seq: int, index: IndexSink) -> SeqVerdict:
        """Batch `seq` of `source` could not be read: whatever it changed is unknown, so the
        source's blocks are dropped as on a gap; the sequence moves on."""
        src = self._sources.setdefault(source, _Source())
        verdict = src.tracker.observe(seq)
        self._drop(source, src, index)
        return verdict

    def _drop(self, source: str, src: _Source, index: IndexSink) -> None:
        drop_publisher(index, source, src.blocks)
        src.blocks.clear()

    def drop_all(self, index: IndexSink) -> None:
        """Forget everything the stream said (before a resync from a snapshot)."""
        for source, src in self._sources.items():
            self._drop(source, src, index)
        self._sources.clear()

    # -- snapshot ------------------------------------------------------------------------

    def encode(self) -> bytes:
        sources = []
        for name, src in sorted(self._sources.items()):
            groups = [
                [where, int(tier), _pack(hashes)]
                for (where, tier), hashes in src.blocks.items()
                if hashes
            ]
            last = -1 if src.tracker.last is None else src.tracker.last
            sources.append([name, last, groups])
        packed: bytes = msgpack.packb(
            {"v": SNAPSHOT_VERSION, "sources": sources}, use_bin_type=True
        )
        return packed

    def restore(self, data: bytes, index: IndexSink) -> int:
        """Replace the mirror with a snapshot's contents and insert them into the index.
        Returns the number of blocks restored. Raises `MalformedEventError` on a bad one."""
        try:
            obj = msgpack.unpackb(data, raw=False)
            if obj.get("v") != SNAPSHOT_VERSION:
                raise MalformedEventError(f"snapshot version {obj.get('v')!r} unknown")
            parsed = [_parse_source(raw) for raw in obj["sources"]]
        except MalformedEventError:
            raise
        except Exception as exc:
            raise MalformedEventError(f"snapshot does not decode: {exc!r}") from exc
        self.drop_all(index)
        restored = 0
        for name, last, groups in parsed:
            src = _Source()
            src.tracker.last = None if last < 0 else last
            for where, tier, hashes in groups:
                src.blocks[(where, tier)] = dict.fromkeys(hashes)
                index.insert(where, hashes, tier)
                restored += len(hashes)
            self._sources[name] = src
        return restored


def _parse_source(raw: Sequence[object]) -> tuple[str, int, list[tuple[str, Tier, list[int]]]]:
    name, last, raw_groups = raw
    if not isinstance(name, str) or not isinstance(last, int) or not isinstance(raw_groups, list):
        raise MalformedEventError("snapshot source entry has the wrong shape")
    groups: list[tuple[str, Tier, list[int]]] = []
    for where, tier, packed in raw_groups:
        if not isinstance(where, str) or not isinstance(packed, bytes) or len(packed) % 8:
            raise MalformedEventError("snapshot block group has the wrong shape")
        groups.append((where, Tier(tier), _unpack(packed)))
    return name, last, groups


def _pack(hashes: Iterable[int]) -> bytes:
    packed = array("Q", hashes)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def _unpack(data: bytes) -> list[int]:
    packed = array("Q")
    packed.frombytes(data)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tolist()
