"""Figures of a cluster run: hit rates by tier, TTFT percentiles, load balance, utilisation,
and the upper bound on the prefix hit rate (one infinite cache, every block ever seen)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from contracts.tiers import Tier
from sim.cluster.floor import ttft_floors
from sim.cluster.reuse import reusable_share
from sim.cluster.simulator import RunRecord
from sim.profiles import Profile
from sim.traces import TraceRequest

TIER_LABELS = (Tier.HBM.label, Tier.HOST.label, Tier.ARRAY.label)


def upper_bound_token_hit_rate(trace: Iterable[TraceRequest], block_tokens: int) -> float:
    """Token hit rate of one infinite prefix cache that has seen every earlier request: the
    workload's reusable maximum (`sim.cluster.reuse`)."""
    ordered = sorted(trace, key=lambda t: t.timestamp_ms)
    return reusable_share(((t.hash_ids, t.input_length) for t in ordered), block_tokens)


def ttft_floor(
    trace: Iterable[TraceRequest], block_tokens: int, profile: Profile
) -> dict[str, float]:
    """The workload's TTFT floor at p50 / p90 / p99 (`sim.cluster.floor`), keyed as a
    policy's figures are, by the same percentile rule: no policy's percentile is below it."""
    floors = ttft_floors(trace, block_tokens, profile)
    return {f"ttft_p{q}_s": _pct(floors, q) for q in (50, 90, 99)}


def distinct_tokens(trace: Iterable[TraceRequest], block_tokens: int) -> int:
    """Tokens of KV in all distinct blocks of the trace (each block counted once)."""
    sizes: dict[int, int] = {}
    for r in trace:
        for i, h in enumerate(r.hash_ids):
            n = min(block_tokens, r.input_length - i * block_tokens)
            if n > sizes.get(h, 0):
                sizes[h] = n
    return sum(sizes.values())


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else 0.0


def summarise(policy: str, run: RunRecord) -> dict[str, Any]:
    """Per-policy figures as `bench cluster` writes them."""
    reqs = run.requests
    ttfts = [r.ttft_s for r in reqs if r.ttft_s is not None]
    # time per output token after the first: how fast the player's stream runs, which
    # other requests' prefills on the same instance slow down (they share its steps)
    tpots = [
        (r.finish_s - r.first_token_s) / (r.output_tokens - 1)
        for r in reqs
        if r.finish_s is not None and r.first_token_s is not None and r.output_tokens > 1
    ]
    prompt = sum(r.prompt_tokens for r in reqs)
    cached = sum(r.cached_tokens for r in reqs)
    by_tier = dict.fromkeys(TIER_LABELS, 0)
    for r in reqs:
        for tier, n in r.cached_by_tier.items():
            by_tier[tier] = by_tier.get(tier, 0) + n
    routed = run.routed
    mean_routed = sum(routed) / len(routed) if routed else 0.0
    span = run.span_s or 1.0
    util = [b / span for b in run.busy_s]
    in_system = sum((r.finish_s or r.arrival_s) - r.arrival_s for r in reqs)
    return {
        "policy": policy,
        "requests": len(reqs),
        "token_hit_rate": cached / prompt if prompt else 0.0,
        "hit_rate_by_tier": {t: (n / prompt if prompt else 0.0) for t, n in by_tier.items()},
        "ttft_p50_s": _pct(ttfts, 50),
        "ttft_p90_s": _pct(ttfts, 90),
        "ttft_p99_s": _pct(ttfts, 99),
        "ttft_mean_s": float(np.mean(ttfts)) if ttfts else 0.0,
        "tpot_p50_s": _pct(tpots, 50),
        "tpot_p90_s": _pct(tpots, 90),
        "tpot_p99_s": _pct(tpots, 99),
        "load_imbalance": max(routed) / mean_routed if mean_routed else 0.0,
        "requests_by_instance": routed,
        "utilisation_mean": sum(util) / len(util) if util else 0.0,
        "utilisation_by_instance": [round(u, 4) for u in util],
        "prefill_share_mean": sum(run.prefill_busy_s) / span / max(1, len(routed)),
        "concurrency_mean_per_instance": in_system / span / max(1, len(routed)),
        "simulated_s": run.span_s,
        "wall_s": run.wall_s,
        "events": run.events,
    }
