"""What tierd and its connector did during one gateway's replay (`bench compare --tiers`).

Read at the end of the replay, before the fleet stops: each tierd's `/v1/stats` (its KV
socket's counters, the prefetch on-time share of `tierd.hints`) and each engine's connector
counters (`TieredInstance.stats()`), summed over the fleet. A fresh fleet per gateway, so
the totals are that replay's (plus one warm-up request per engine). Figures:

- ``prefetch_on_time_share``: of the hinted blocks the engines asked tierd for, the share
  that was in tierd's host memory by then (`tierd.hints`);
- ``tierd_loaded_tokens``: prompt tokens the engines loaded from tierd instead of computing;
- ``save_ms_per_block`` (the save's own time) and ``save_wait_ms_per_block`` (what the
  engines' steps waited for it: the part left on the critical path);
- lookups and the connector's lookup round trip inside the engines (p50, the worst engine's);
- why hinted blocks were late: ``prefetch_evicted_before_ask`` (in host memory, then evicted
  before the engine asked), ``prefetch_late_absent_at_hint`` (in no tier when hinted),
  ``prefetch_late_hint_after_ask`` (the engine asked before the hint came; vLLM's retries
  of a waiting request, ``prefetch_reasked``, are not asks of their own), the
  prefetches' own outcomes (``prefetch_outcomes``: passed over as held by the engine,
  hit, on_time, late, abandoned at the hint's deadline, miss) and L1's evictions.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from gateway.launch.tiered import TieredFleet
from tierd.prefetch import OUTCOMES as PREFETCH_OUTCOMES

SUMMED = (
    "loaded_blocks", "load_failed_blocks", "load_us", "saved_blocks", "save_us",
    "save_wait_us", "save_waits", "save_skipped_blocks", "lookups", "lookup_hit_blocks",
    "lookups_deferred", "lookups_reused",
)  # fmt: skip
TIERS_NOTE = (
    "From each tierd and each engine's connector at the end of the replay. Prefetch on "
    "time: of the hinted blocks the engines then asked tierd for, the share already in "
    "tierd's host memory. Save: the connector's own time per block, and the part of it the "
    "engine's next step waited for (saves run off the critical path)."
)
HINTS = (
    "prefetch_hinted_blocks", "prefetch_on_time", "prefetch_late", "prefetch_evicted_before_ask",
    "prefetch_hint_expired", "prefetch_late_absent_at_hint", "prefetch_late_hint_after_ask",
    "prefetch_reasked",
)  # fmt: skip
OUTCOMES = ("requests", *PREFETCH_OUTCOMES)


def _collect(fleet: TieredFleet) -> dict[str, Any]:
    conn: dict[str, int] = dict.fromkeys(SUMMED, 0)
    hints: dict[str, int] = dict.fromkeys(HINTS, 0)
    outcomes: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
    l1_evictions = 0
    rtt_p50: list[int] = []
    for inst in fleet.instances:
        c = inst.stats()
        for k in SUMMED:
            conn[k] += int(c.get(k, 0))
        if "lookup_rtt_p50_us" in c:
            rtt_p50.append(int(c["lookup_rtt_p50_us"]))
        with contextlib.suppress(Exception):  # a tierd that died: its figures are missing
            stats = inst.tierd.stats()
            kv = stats.get("connector") or {}
            for k in HINTS:
                hints[k] += int(kv.get(k, 0))
            prefetch = stats.get("prefetch") or {}
            for k in OUTCOMES:
                outcomes[k] += int(prefetch.get(k, 0))
            l1_evictions += int((stats.get("evictions") or {}).get("l1", 0))
    asked = hints["prefetch_on_time"] + hints["prefetch_late"]
    saved = conn["saved_blocks"]
    block = fleet.cfg.block_size or 128
    return {
        "prefetch_on_time_share": round(hints["prefetch_on_time"] / asked, 4) if asked else None,
        **hints,
        "prefetch_outcomes": outcomes,
        "tierd_l1_evictions": l1_evictions,
        "tierd_loaded_tokens": conn["loaded_blocks"] * block,
        "tierd_loaded_blocks": conn["loaded_blocks"],
        "tierd_load_failed_blocks": conn["load_failed_blocks"],
        "tierd_saved_blocks": saved,
        "save_ms_per_block": round(conn["save_us"] / saved / 1000, 3) if saved else None,
        "save_wait_ms_per_block": round(conn["save_wait_us"] / saved / 1000, 3) if saved else None,
        "tierd_lookups": conn["lookups"],
        "tierd_lookups_reused": conn["lookups_reused"],
        "lookup_rtt_p50_us_worst_engine": max(rtt_p50) if rtt_p50 else None,
    }


def tierd_pids(fleet: object) -> list[int]:
    """The tierd processes of a bench fleet with tierds (`RealFleet`); [] without."""
    inner = getattr(fleet, "fleet", None)
    if not isinstance(inner, TieredFleet):
        return []
    return [i.tierd.tree.pid for i in inner.instances if i.tierd.tree is not None]


async def tier_figures(fleet: object) -> dict[str, Any]:
    """The figures above for a bench fleet with tierds (`RealFleet`); {} without."""
    inner = getattr(fleet, "fleet", None)
    if not isinstance(inner, TieredFleet):
        return {}
    return await asyncio.to_thread(_collect, inner)


def tiers_table(gateways: Mapping[str, Mapping[str, Any]]) -> str:
    """report.md's tier table: one row per gateway that ran with tierds."""
    rows = [
        "| gateway | prefetch on time | hinted blocks asked | tokens loaded from tierd | "
        "loads failed | blocks saved | save ms/block | of it on the critical path | "
        "lookup RTT p50 µs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in gateways.items():
        if "tierd_saved_blocks" not in r:
            continue
        share = r.get("prefetch_on_time_share")
        asked = r.get("prefetch_on_time", 0) + r.get("prefetch_late", 0)
        rows.append(
            f"| {name} | {'–' if share is None else f'**{100 * share:.1f}%**'} | {asked} | "
            f"{r['tierd_loaded_tokens']} | {r['tierd_load_failed_blocks']} | "
            f"{r['tierd_saved_blocks']} | {r.get('save_ms_per_block')} | "
            f"{r.get('save_wait_ms_per_block')} | {r.get('lookup_rtt_p50_us_worst_engine')} |"
        )
    return "\n".join(rows)
