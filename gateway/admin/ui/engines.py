"""What each engine says about its own load, for the operator page: KV cache use, requests
running and waiting, prompt and cached tokens by source, from its Prometheus metrics page
(read by the instance's engine kind, `Engine.load`: vLLM's names, whose gauges the simulated
engine publishes too), scraped every `interval_s` per instance of the fleet as it is now. A
failed scrape keeps the last figures and says why."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from gateway.config.settings import InstanceSettings
from gateway.engine.base import EngineLoad
from gateway.state import AppState

log = logging.getLogger("warmgate.ui")


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


async def scrape_once(state: AppState, into: dict[str, dict[str, Any]]) -> None:
    timeout = state.settings.health.timeout_s
    fleet = state.health.instances()

    async def one(inst: InstanceSettings) -> None:
        entry = into.setdefault(inst.id, {})
        engine = inst.adapter
        try:
            r = await state.client.get(f"{inst.url}{engine.metrics_path}", timeout=timeout)
            r.raise_for_status()
        except Exception as exc:  # down or without /metrics: the page says so
            entry["error"] = f"{type(exc).__name__}: {exc}".rstrip(": ")
            return
        entry.update(engine_figures(engine.load(r.text)))
        entry["error"] = None
        entry["scraped_at"] = time.time()

    await asyncio.gather(*(one(i) for i in fleet))
    for gone in set(into) - {i.id for i in fleet}:
        del into[gone]


async def run_scraper(state: AppState, into: dict[str, dict[str, Any]], interval_s: float) -> None:
    while True:
        try:
            await scrape_once(state, into)
        except Exception as exc:  # one bad round never stops the loop
            log.warning("engine scrape failed: %r", exc)
        await asyncio.sleep(interval_s)
