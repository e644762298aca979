"""The shared-state protocol: what gateway replicas share, whatever stores it.

Four things are shared (DESIGN §4):
- session bindings `player -> instance`, with a TTL refreshed on use; binding is
  set-if-absent, so two replicas that route a player's first turn at once agree;
- in-flight counts per instance, published by each gateway replica with a TTL, so a dead
  replica's counts expire on their own; each replica reads the others' totals;
- residency events (vLLM KV event batches, exactly as on the ZMQ wire) fanned in through an
  append-only stream that every replica reads in full;
- a snapshot of what the stream has said so far (plus the stream ID it covers), written
  periodically by one replica under a lock, so a new replica needs not replay from the start.

`memory` keeps all of it in-process (one replica; the default); `redis` shares it between
replicas. Backends raise `StateUnavailableError` when their store cannot be reached; callers
go on from local state and retry later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from contracts.errors import StateError

STREAM_START = "0-0"  # read the stream from its beginning


class StateUnavailableError(StateError):
    """The shared store cannot be reached (or answered too late)."""


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One residency event batch in the stream: fields `instance`, `seq`, `batch`."""

    id: str
    instance: str
    seq: int
    batch: bytes


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A compact encoding of the stream's effect up to and including `stream_id`."""

    data: bytes
    stream_id: str
    written_at_s: float  # wall clock (unix seconds) when it was written


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One live gateway replica's published in-flight counts."""

    replica: str
    counts: Mapping[str, int]


def stream_id_key(stream_id: str) -> tuple[int, int]:
    """Order stream IDs (`ms-seq`) numerically."""
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def sum_loads(loads: list[ReplicaLoad]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for load in loads:
        for instance, n in load.counts.items():
            totals[instance] = totals.get(instance, 0) + n
    return totals


class SharedState(Protocol):
    """One pool's shared state. Every call is short and bounded in time."""

    backend: str
    pool: str
    # whether anyone outside this process reads or writes it (other replicas, tierds): when
    # not, the gateway runs none of the sync loops over it
    shared: bool

    async def ping(self) -> None:
        """Raise `StateUnavailableError` unless the store answers."""

    async def close(self) -> None: ...

    # -- sessions ------------------------------------------------------------------------

    async def bind_session(self, key: str, instance: str, ttl_s: float) -> str:
        """Bind `key` to `instance` unless it is bound already; return the binding in
        effect (the existing one wins) and refresh its TTL."""

    async def get_session(self, key: str, ttl_s: float) -> str | None:
        """The instance `key` is bound to (TTL refreshed), or None."""

    async def rebind_session(
        self, key: str, expected: str | None, instance: str, ttl_s: float
    ) -> str:
        """Compare-and-set: move `key` to `instance` if it is still bound to `expected`
        (or unbound); return the binding in effect."""

    async def unbind_session(self, key: str) -> None: ...

    # -- in-flight counts ----------------------------------------------------------------

    async def publish_inflight(self, replica: str, counts: Mapping[str, int], ttl_s: float) -> None:
        """Replace `replica`'s in-flight counts; they expire after `ttl_s` unless republished."""

    async def read_inflight(self) -> list[ReplicaLoad]:
        """Every live replica's counts (expired replicas are dropped)."""

    # -- residency event stream ----------------------------------------------------------

    async def append_event(self, instance: str, seq: int, batch: bytes) -> str:
        """Append one event batch; return its stream ID."""

    async def read_events(self, after: str, count: int, block_s: float) -> list[StreamEntry]:
        """Entries after `after`, oldest first; wait up to `block_s` when there are none."""

    async def oldest_event_id(self) -> str | None:
        """The ID of the oldest entry still in the (trimmed) stream, or None when empty."""

    # -- snapshot and lock ---------------------------------------------------------------

    async def save_snapshot(self, snapshot: Snapshot) -> None: ...

    async def load_snapshot(self) -> Snapshot | None: ...

    async def acquire_lock(self, name: str, owner: str, ttl_s: float) -> bool:
        """Take the lock `name`, or extend it when `owner` holds it already."""

    async def release_lock(self, name: str, owner: str) -> None: ...
