"""What each engine says about its own load, for the operator page: KV cache use, requests
running and waiting, from its Prometheus `/metrics` (vLLM's names; the simulated engine
publishes the same), scraped every `interval_s` per instance of the fleet as it is now. A
failed scrape keeps the last figures and says why."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from typing import Any

from gateway.state import AppState

log = logging.getLogger("warmgate.ui")

GAUGES = {
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
}
_SAMPLE = re.compile(r"^(vllm:[a-z_]+)(?:\{[^}]*\})?\s+(\S+)$", re.MULTILINE)


def parse_engine_gauges(text: str) -> dict[str, float]:
    """kv_usage (0..1, the largest over data-parallel ranks), running and waiting (summed)."""
    out: dict[str, float] = {}
    for name, raw in _SAMPLE.findall(text):
        key = GAUGES.get(name)
        if key is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        if key == "kv_usage":
            out[key] = max(out.get(key, 0.0), value)
        else:
            out[key] = out.get(key, 0.0) + value
    return out


async def scrape_once(state: AppState, into: dict[str, dict[str, Any]]) -> None:
    timeout = state.settings.health.timeout_s
    fleet = state.health.instances()

    async def one(instance_id: str, url: str) -> None:
        entry = into.setdefault(instance_id, {})
        try:
            r = await state.client.get(f"{url}/metrics", timeout=timeout)
            r.raise_for_status()
        except Exception as exc:  # down or without /metrics: the page says so
            entry["error"] = f"{type(exc).__name__}: {exc}".rstrip(": ")
            return
        entry.update(parse_engine_gauges(r.text))
        entry["error"] = None
        entry["scraped_at"] = time.time()

    await asyncio.gather(*(one(i.id, i.url) for i in fleet))
    for gone in set(into) - {i.id for i in fleet}:
        del into[gone]


async def run_scraper(state: AppState, into: dict[str, dict[str, Any]], interval_s: float) -> None:
    while True:
        try:
            await scrape_once(state, into)
        except Exception as exc:  # one bad round never stops the loop
            log.warning("engine scrape failed: %r", exc)
        await asyncio.sleep(interval_s)
