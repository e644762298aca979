"""The engines' own view of a replay: their Prometheus counters, sampled over time.

A gateway that passes no instance header still cannot hide where requests went: every
simulated engine counts its requests and its prefix-cache queries and hits (vLLM metric
names). `MetricsPoller` scrapes each engine's `/metrics` before the replay, every
`interval_s` during it and after it; the differences give, per instance, the requests it
served, the prompt tokens it was asked about and the tokens it found cached: in its own
HBM prefix cache (`vllm:prefix_cache_hits`) or loaded from a slower tier through tierd
(`vllm:external_prefix_cache_hits`, split by tier in `warmgate_sim_tier_loaded_tokens`);
the samples over time give requests per instance over time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

# Sample name -> our key; the first request counter an engine exports is used.
REQUEST_COUNTERS = ("vllm:request_success_total", "vllm:time_to_first_token_seconds_count")
SIMPLE = {
    "vllm:prefix_cache_queries_total": "queries",  # prompt tokens looked up
    "vllm:prefix_cache_hits_total": "hits",  # found in the engine's own HBM cache
    "vllm:external_prefix_cache_hits_total": "external_hits",  # loaded from slower tiers
    "vllm:time_to_first_token_seconds_sum": "ttft_sum",  # the engine's own view, wall s
    "vllm:time_to_first_token_seconds_count": "ttft_count",
}
TIER_LOADED = "warmgate_sim_tier_loaded_tokens_total"  # loaded tokens by `tier` label
HBM = "HBM"


def parse_counters(text: str) -> dict[str, float]:
    """Flatten the samples we use from a Prometheus exposition text: requests, prefix-cache
    queries and hits, external (tier) hits, and tokens loaded by tier (as `loaded:<tier>`)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, value = sample.name, float(sample.value)
            key = SIMPLE.get(name)
            if name in REQUEST_COUNTERS:
                out[name] = out.get(name, 0.0) + value
            elif name == TIER_LOADED:
                key = f"loaded:{sample.labels.get('tier', '?')}"
            if key is not None:
                out[key] = out.get(key, 0.0) + value
    for name in REQUEST_COUNTERS:
        if name in out:
            out["requests"] = out[name]
            break
    return out


@dataclass(slots=True)
class EngineDelta:
    """What one instance did between two scrapes (tokens, except `requests`)."""

    requests: float = 0.0
    queries: float = 0.0
    hits: float = 0.0  # HBM hits
    external_hits: float = 0.0  # loaded from tierd instead of computed
    ttft_sum: float = 0.0  # seconds from arrival at the engine to its first token, summed
    ttft_count: float = 0.0
    loaded_by_tier: dict[str, float] = field(default_factory=dict)

    @property
    def cached(self) -> float:
        return self.hits + self.external_hits

    @property
    def hits_by_tier(self) -> dict[str, float]:
        """Cached tokens by the tier they came from: HBM, then each slower tier."""
        return {HBM: self.hits, **self.loaded_by_tier}


def delta(before: Mapping[str, float], after: Mapping[str, float]) -> EngineDelta:
    d = EngineDelta(
        requests=after.get("requests", 0.0) - before.get("requests", 0.0),
        queries=after.get("queries", 0.0) - before.get("queries", 0.0),
        hits=after.get("hits", 0.0) - before.get("hits", 0.0),
        external_hits=after.get("external_hits", 0.0) - before.get("external_hits", 0.0),
        ttft_sum=after.get("ttft_sum", 0.0) - before.get("ttft_sum", 0.0),
        ttft_count=after.get("ttft_count", 0.0) - before.get("ttft_count", 0.0),
    )
    for key, value in after.items():
        if key.startswith("loaded:"):
            d.loaded_by_tier[key[7:]] = value - before.get(key, 0.0)
    return d


class MetricsPoller:
    """Samples every engine's counters every `interval_s` until stopped."""

    def __init__(self, engines: Mapping[str, str], interval_s: float = 1.0) -> None:
        self.engines = dict(engines)  # instance id -> base URL (no /v1)
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[str, dict[str, float]]]] = []
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None
        self._t0 = 0.0

    async def scrape(self) -> dict[str, dict[str, float]]:
        assert self._client is not None
        client = self._client

        async def one(url: str) -> dict[str, float]:
            try:
                r = await client.get(url.rstrip("/") + "/metrics")
                return parse_counters(r.text) if r.status_code == 200 else {}
            except httpx.HTTPError:
                return {}

        values = await asyncio.gather(*(one(u) for u in self.engines.values()))
        prev = self.samples[-1][1] if self.samples else {}
        # A failed scrape keeps that instance's previous values rather than reading as 0.
        return {
            inst: (value if value else prev.get(inst, {}))
            for inst, value in zip(self.engines, values, strict=True)
        }

    async def start(self) -> None:
        self._client = httpx.AsyncClient(timeout=5.0)
        self._t0 = time.perf_counter()
        self.samples.append((0.0, await self.scrape()))
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            snap = await self.scrape()
            self.samples.append((time.perf_counter() - self._t0, snap))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.samples.append((time.perf_counter() - self._t0, await self.scrape()))
        if self._client is not None:
            await self._client.aclose()

    def totals(self) -> dict[str, EngineDelta]:
        """Per instance: what it did from the first sample to the last."""
        if not self.samples:
            return {}
        first, last = self.samples[0][1], self.samples[-1][1]
        return {i: delta(first.get(i, {}), last.get(i, {})) for i in self.engines}

    def requests_over_time(self) -> dict[str, list[tuple[float, float]]]:
        """Per instance: (seconds from start, requests completed in that interval)."""
        series: dict[str, list[tuple[float, float]]] = {i: [] for i in self.engines}
        for (_, prev), (t, cur) in zip(self.samples, self.samples[1:], strict=False):
            for inst in self.engines:
                done = cur.get(inst, {}).get("requests", 0.0) - prev.get(inst, {}).get(
                    "requests", 0.0
                )
                series[inst].append((t, max(0.0, done)))
        return series
