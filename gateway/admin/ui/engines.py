"""What each engine says about its own load, for the operator page: KV cache use, requests
running and waiting, prompt and cached tokens by source. The page shows the scrapes the
gateway already makes (gateway/fleet/engine_load.py, every `engine_metrics.interval_s`): the
last good one, and why the latest failed when it did. Nothing here scrapes."""

from __future__ import annotations

from typing import Any

from gateway.engine.base import EngineLoad
from gateway.fleet.engine_load import EngineLoads


def engine_figures(load: EngineLoad) -> dict[str, Any]:
    """What the page shows of one scrape (its engine kind's `load`): KV use (0..1), running,
    waiting, and the prompt tokens by source and cached tokens by source (cumulative; absent
    on engines that do not publish them)."""
    out: dict[str, Any] = {
        k: v
        for k, v in (
            ("kv_usage", load.kv_usage),
            ("running", load.running),
            ("waiting", load.waiting),
        )
        if v is not None
    }
    if load.cached_tokens_by_source:
        out["cached_by_source"] = dict(load.cached_tokens_by_source)
    if load.prompt_tokens_by_source:
        out["prompt_by_source"] = dict(load.prompt_tokens_by_source)
    return out


def engine_entry(loads: EngineLoads | None, instance: str) -> dict[str, Any]:
    """One instance's engine figures for the page: `{}` before its first scrape (or with
    `engine_metrics.enabled` false); the last good figures, `scraped_at`, and `error` (None,
    or why the latest scrape failed)."""
    if loads is None:
        return {}
    entry: dict[str, Any] = {}
    good = loads.last_good.get(instance)
    if good is not None:
        entry.update(engine_figures(good[0]))
        entry["scraped_at"] = good[1]
    error = loads.errors.get(instance)
    if good is not None or error is not None:
        entry["error"] = error
    return entry


def engine_sums(loads: EngineLoads | None, key: str) -> dict[str, float]:
    """`key` (`cached_by_source` or `prompt_by_source`) summed over the engines' last good
    scrapes."""
    out: dict[str, float] = {}
    for load, _ in list(loads.last_good.values()) if loads is not None else []:
        for source, n in (engine_figures(load).get(key) or {}).items():
            out[source] = out.get(source, 0.0) + n
    return out
