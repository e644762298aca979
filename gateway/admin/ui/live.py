"""The operator page's data: one JSON document (`GET /admin/ui/state`) with the fleet as this
replica sees it, the engines' own load, recent history and the hottest sessions and
prefixes. Attached as a gateway extension (`attach`), which starts the engine scraper and
the history sampler.

History: every `ui.sample_interval_s` the cumulative counters are sampled (requests, prompt tokens,
cached tokens predicted by tier and reported by the engines, tierd's slice loads by tier);
the page turns consecutive samples into rates per interval, over the last `ui.history_s`."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

from gateway.admin.ui.engines import engine_entry, engine_sums
from gateway.admin.ui.runtime import UiRuntime
from gateway.state import AppState
from router.index import ARRAY


def _tierd_hits(state: AppState) -> dict[str, int]:
    out: dict[str, int] = {}
    for stats in list(state.tier_stats.values()):
        hits = stats.get("hits") if isinstance(stats, dict) else None
        if isinstance(hits, dict):
            for tier, n in hits.items():
                if isinstance(n, int):
                    out[str(tier)] = out.get(str(tier), 0) + n
    return out


def sample(state: AppState, ui: UiRuntime) -> dict[str, Any]:
    r = state.router.stats()
    requests = state.stats.to_dict().get("requests", {})
    return {
        "t": time.time(),
        "requests": requests.get("total", 0),
        "ok": requests.get("ok", 0),
        "prompt_tokens": r["prompt_tokens"],
        "predicted_cached": r["predicted_cached_tokens"],
        "reported_cached": r["reported_cached_tokens"],
        "predicted_when_reported": r["predicted_cached_tokens_when_reported"],
        "routed_prompt_tokens": ui.hot.routed_prompt_tokens,
        "predicted_by_tier": dict(ui.hot.predicted_by_tier),
        "tierd_hits": _tierd_hits(state),
        # vLLM's own split (device, host, disk, ...), where the engines publish it
        "engine_cached_by_source": engine_sums(state.engine_load, "cached_by_source"),
        "engine_prompt_by_source": engine_sums(state.engine_load, "prompt_by_source"),
    }


async def run_sampler(state: AppState, ui: UiRuntime) -> None:
    while True:
        ui.history.append(sample(state, ui))
        await asyncio.sleep(state.settings.ui.sample_interval_s)


def _tierd_tiers(stats: dict[str, Any] | None) -> dict[str, Any]:
    """Slices per tier as the instance's tierd reports them."""
    tiers = (stats or {}).get("tiers")
    if not isinstance(tiers, dict):
        return {}
    return {name: t.get("slices") for name, t in tiers.items() if isinstance(t, dict)}


def ui_state(state: AppState, ui: UiRuntime) -> dict[str, Any]:
    block_tokens = state.settings.routing.index_block_tokens
    index = state.router.index
    fleet = state.fleet
    instances = []
    for inst in state.health.instances():
        h = state.health.health[inst.id]
        in_flight, queued = state.router.load.view(inst.id)
        held, predicted = index.blocks_held(inst.id), index.predicted_held(inst.id)
        tierd = state.tier_stats.get(inst.id)
        instances.append(
            {
                "id": inst.id,
                "url": inst.url,
                "models": state.health.models_of(inst.id),
                "health": {"state": h.state, "reason": h.reason, "since": h.since},
                "fleet": fleet.status_of(inst.id) if fleet is not None else None,
                "in_flight": in_flight,
                "queued_prefill_tokens": queued,
                "engine": engine_entry(state.engine_load, inst.id),
                "believed_tokens": {
                    # a block both predicted and reported by events counts once in any_tier
                    "any_tier": held * block_tokens,
                    "predicted_hbm": predicted * block_tokens,
                },
                "tierd": None
                if tierd is None
                else {"error": tierd.get("error"), "slices": _tierd_tiers(tierd)},
            }
        )
    stats = state.stats.to_dict()
    return {
        "now": time.time(),
        "policy": state.router.policy.name,
        "mode": state.settings.routing.mode,
        "block_tokens": block_tokens,
        "instances": instances,
        "array_tokens_believed": index.blocks_held(ARRAY) * block_tokens,
        "stats": {k: stats.get(k) for k in ("requests", "cached_tokens", "ttft_s", "failovers")},
        "warm": state.warmer.stats() if state.warmer is not None else None,
        "history": [*ui.history, sample(state, ui)],
        "hot": ui.hot.top(10),
    }


def ui_of(state: AppState) -> UiRuntime:
    assert state.ui is not None, "gateway.admin.ui.live is attached in the lifespan"
    return state.ui


async def attach_ui(state: AppState) -> None:
    cfg = state.settings.ui
    ui = UiRuntime(deque(maxlen=int(cfg.history_s / cfg.sample_interval_s) + 1))
    state.router.dispatch_observers.append(ui.hot.observe)
    state.ui = ui
    state.spawn(run_sampler(state, ui), "ui-history")
