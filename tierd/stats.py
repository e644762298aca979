"""The `/v1/stats` document of one store: tier usage, measured and configured bandwidths,
counters, events. (Prometheus reads the same numbers: `tierd.metrics`.) Each level's key and
medium are `contracts.tiers.TIERD_LEVELS`'; bandwidths are keyed by `Tier.label`."""

from __future__ import annotations

from typing import Any

from contracts.tiers import TIERD_ARENA, TIERD_ARRAY, TIERD_SNAPSHOT
from tierd.store import TieredStore


def store_stats(st: TieredStore) -> dict[str, Any]:
    c = st.counters
    return {
        "ready": st.ready,
        "slice_bytes": st.settings.slice_bytes,
        "tiers": {
            TIERD_ARENA.key: {
                "medium": TIERD_ARENA.medium,
                "backend": st.l1.backend,
                "slots": st.l1.slots,
                "slices": len(st.l1),
                "free_slots": st.l1.free_slots,
                "used_bytes": st.l1.used_bytes,
                "capacity_bytes": st.l1.slots * st.l1.slot_bytes,
                "protected_slices": st.sessions.protected_count,
                "sessions": len(st.sessions),
            },
            TIERD_ARRAY.key: {
                "medium": TIERD_ARRAY.medium,
                "dir": str(st.settings.array_dir),
                "o_direct": st.array.direct,
                "slices": len(st.array_index),
                "used_bytes": st.array_bytes,
                "capacity_bytes": st.settings.array_bytes or None,
            },
            TIERD_SNAPSHOT.key: {
                "medium": TIERD_SNAPSHOT.medium,
                "dir": str(st.settings.snapshot_dir),
                "snapshots": len(st.snapshots),
                "slices": len(st.snap_index),
                "object_bytes": st.snapshot_bytes,
                "capacity_bytes": st.settings.snapshot_bytes or None,
            },
        },
        "bandwidth_bytes_per_s": {
            # by Tier.label (the gateway reads them so); in emulated seconds, like the engines'
            # clock: wall rate x time scale
            "measured": {
                k: _emulated(m.rate(), st.emulator.time_scale) for k, m in st.meters.items()
            },
            "configured": {
                TIERD_ARRAY.tier.label: st.emulator.array.bytes_per_s or None,
                TIERD_SNAPSHOT.tier.label: st.emulator.snapshot.bytes_per_s or None,
            },
        },
        "emulation": st.emulator.describe(),
        "bytes_moved": dict(c.bytes_moved),
        "hits": dict(c.hits),
        "prefetch": {"requests": c.prefetch_requests, **c.prefetch},
        "evictions": dict(c.evictions),
        "demotions": dict(c.demotions),
        "gated": c.gated,
        "write_failures": c.write_failures,
        "corrupt": dict(c.corrupt),
        "recovered": dict(c.recovered),
        "snapshots_written": c.snapshots_written,
        "idle_snapshots": c.idle_snapshots,
        "events": st.events.stats(),
    }


def _emulated(wall_rate: float | None, time_scale: float) -> float | None:
    return None if wall_rate is None else wall_rate * time_scale
