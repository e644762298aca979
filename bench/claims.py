"""The seed's tiering claims, measured live: TTFT p50 and throughput with KV tiers and without.

The seed (a vendor's figures, not independently checked) claims TTFT p50 -26% to -32% from
KV tiering at 8-16 concurrent requests per instance, and throughput +35% to +40%. Here the
same requests (the workload's first `requests`, in arrival order) are sent closed loop, at a
fixed number of concurrent requests (8 and 16 per instance), through warmgate (`ttft`) to
two fresh fleets:

- tiers: every engine with its tierd, one shared array directory (L1 arena + array +
  snapshots; the engine charges tier loads at the profile's bandwidths);
- no array: the engines alone, HBM prefix cache only (tierd off, so no array either).

Throughput is generated tokens per second of modelled time over the run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.peers import FleetSpec, fleet_with_gateway
from bench.replay import ReplayItem, replay
from bench.report import summarize

SEED_CLAIM = (
    "TTFT p50 -26% to -32% from KV tiering at 8-16 concurrent requests per instance, "
    "throughput +35% to +40% (vendor figures, not independently checked)"
)
LEVELS = (8, 16)
GATEWAY = "warmgate-ttft"


def _change(new: float | None, base: float | None) -> float | None:
    if new is None or base is None or base == 0:
        return None
    return round((new - base) / base * 100.0, 1)


async def _closed_loop(
    spec: FleetSpec,
    items: Sequence[ReplayItem],
    concurrency: int,
    logs: Path,
    label: str,
    budget_s: float | None,
) -> dict[str, Any]:
    async with fleet_with_gateway(spec, GATEWAY, keep_logs=logs) as (_, gw):
        assert gw is not None
        t0 = time.perf_counter()
        records = await replay(
            gw.base_url, items, model=spec.model, closed_loop=True, concurrency=concurrency,
            instance_by_url=gw.instance_by_url, progress_label=label, stop_after_s=budget_s,
        )  # fmt: skip
        duration = time.perf_counter() - t0
    return summarize(records, None, time_scale=spec.time_scale, duration_s=duration)


async def run_claims(
    spec: FleetSpec,
    items: Sequence[ReplayItem],
    *,
    requests: int,
    tmp: Path,
    levels: Sequence[int] = LEVELS,
    budget_s: float | None = None,
) -> dict[str, Any]:
    """The `claims` section of results.json."""
    subset = sorted(items, key=lambda it: it.at_s)[:requests]
    out: dict[str, Any] = {
        "method": (
            f"warmgate (ttft), the workload's first {len(subset)} requests closed loop at "
            f"{'/'.join(str(c) for c in levels)} concurrent requests per instance; 'tiers' = "
            "engines with tierd and one shared array, 'no array' = engines alone (HBM prefix "
            f"cache only), HBM KV capacity {spec.kv_capacity_tokens or 'of the profile'} tokens "
            "per instance in both. Fresh fleets for each run. Throughput = generated tokens / s. "
            + (f"No request is sent after {budget_s:g} s of wall time." if budget_s else "")
        ),
        "seed_claim": SEED_CLAIM,
        "cases": [],
    }
    for level in levels:
        conc = level * spec.instances
        tiers = await _closed_loop(
            replace(spec, tierd=True, array=True), subset, conc,
            tmp / "logs" / f"claims-{level}-tiers", f"tiers@{level}", budget_s,
        )  # fmt: skip
        bare = await _closed_loop(
            replace(spec, tierd=False), subset, conc,
            tmp / "logs" / f"claims-{level}-no-array", f"no-array@{level}", budget_s,
        )  # fmt: skip
        out["cases"].append(
            {
                "concurrency_per_instance": level,
                "ttft_p50_tiers_s": tiers["ttft_p50_s"],
                "ttft_p50_no_array_s": bare["ttft_p50_s"],
                "ttft_p50_change_pct": _change(tiers["ttft_p50_s"], bare["ttft_p50_s"]),
                "throughput_tiers_tok_s": tiers["output_tokens_per_s"],
                "throughput_no_array_tok_s": bare["output_tokens_per_s"],
                "throughput_change_pct": _change(
                    tiers["output_tokens_per_s"], bare["output_tokens_per_s"]
                ),
                "cached_ratio_tiers": tiers["cached_token_ratio"],
                "cached_ratio_no_array": bare["cached_token_ratio"],
                "errors": tiers["errors"] + bare["errors"],
                "requests_tiers": tiers["requests"],
                "requests_no_array": bare["requests"],
            }
        )
    return out
