"""What each engine reports about its own load and prompt tokens, used by the gateway.

A background task scrapes every instance's metrics page each `engine_metrics.interval_s`,
read by the instance's engine kind (`Engine.load` -> `gateway.engine.base.EngineLoad`; the
series named here are vLLM's, which the simulated engine publishes too):

- load: `vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc` (and running) are shown
  per instance in `/admin/instances` and exported as `warmgate_engine_*` gauges. They also
  veto: an instance whose engine has `veto_waiting` or more requests waiting, or whose KV
  cache is `veto_kv_usage` full or more, leaves the candidate set while any candidate is
  not overloaded (as smg's overload check does; the gateway's own in-flight counts cannot
  see requests other gateways or clients sent). When every candidate is overloaded none is
  vetoed: routing then goes by the policy's own view.
- accounting: `vllm:prompt_tokens_by_source_total` (local_compute, local_cache_hit,
  external_kv_transfer) and `vllm:prompt_tokens_cached_by_source_total` (device, host,
  disk, p2p), shown beside warmgate's predicted-vs-reported cached tokens in
  `/admin/stats` (`engine_reported`) and exported as `warmgate_engine_prompt_tokens` /
  `warmgate_engine_cached_prompt_tokens` gauges (the engine's own counter values).

A scrape that fails keeps nothing stale for routing: the instance's load is forgotten (no
veto) until it answers again. The operator page (gateway/admin/ui/) shows these same scrapes,
the last good one beside why the latest failed: one scrape of each page per interval, whoever
reads it (a second scraper for the page cost the idle gateway a fifth of its CPU).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from gateway.config.settings import InstanceSettings, Settings
from gateway.engine.base import EngineLoad
from gateway.fleet.engine_pages import EnginePages, PageUnavailable
from gateway.fleet.health import HealthChecker
from gateway.lifetime import Lifetime

log = logging.getLogger("warmgate.engine_load")


@dataclass(frozen=True, slots=True)
class Veto:
    waiting: int | None = 32  # num_requests_waiting at or above this: overloaded
    kv_usage: float | None = 0.99  # kv_cache_usage_perc at or above this: overloaded


class EngineLoadGauges:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.waiting = Gauge(
            "warmgate_engine_requests_waiting",
            "vllm:num_requests_waiting as each instance's engine last reported it.",
            ["instance"],
            registry=registry,
        )
        self.kv_usage = Gauge(
            "warmgate_engine_kv_cache_usage",
            "vllm:kv_cache_usage_perc (0..1) as each instance's engine last reported it.",
            ["instance"],
            registry=registry,
        )
        self.prompt = Gauge(
            "warmgate_engine_prompt_tokens",
            "vllm:prompt_tokens_by_source_total of each instance's engine, by source.",
            ["instance", "source"],
            registry=registry,
        )
        self.cached = Gauge(
            "warmgate_engine_cached_prompt_tokens",
            "vllm:prompt_tokens_cached_by_source_total of each instance's engine, by source.",
            ["instance", "source"],
            registry=registry,
        )


class EngineLoads:
    """The last scrape of each instance's engine metrics, and the overload veto."""

    def __init__(self, veto: Veto, gauges: EngineLoadGauges | None = None) -> None:
        self.veto = veto
        self.gauges = gauges
        self.loads: dict[str, EngineLoad] = {}  # the latest scrape, when it succeeded
        self.scraped_at: dict[str, float] = {}
        self.last_good: dict[str, tuple[EngineLoad, float]] = {}  # (load, when), for display
        self.errors: dict[str, str] = {}  # why the latest scrape failed
        self.vetoes = 0  # candidates left out for overload, counted per decision

    def update(self, instance: str, load: EngineLoad | None, error: str | None = None) -> None:
        """The latest scrape of `instance`: its load, or None and why it failed."""
        if load is None:
            self.loads.pop(instance, None)
            self.scraped_at.pop(instance, None)
            self.errors[instance] = error or "no answer"
            return
        now = time.time()
        self.loads[instance] = load
        self.scraped_at[instance] = now
        self.last_good[instance] = (load, now)
        self.errors.pop(instance, None)
        g = self.gauges
        if g is None:
            return
        if load.waiting is not None:
            g.waiting.labels(instance).set(load.waiting)
        if load.kv_usage is not None:
            g.kv_usage.labels(instance).set(load.kv_usage)
        for source, value in load.prompt_tokens_by_source.items():
            g.prompt.labels(instance, source).set(value)
        for source, value in load.cached_tokens_by_source.items():
            g.cached.labels(instance, source).set(value)

    def overloaded(self, instance: str) -> str | None:
        """Why the engine counts as overloaded, or None."""
        load = self.loads.get(instance)
        if load is None:
            return None
        v = self.veto
        if v.waiting is not None and load.waiting is not None and load.waiting >= v.waiting:
            return f"{load.waiting:.0f} requests waiting (veto at {v.waiting})"
        if v.kv_usage is not None and load.kv_usage is not None and load.kv_usage >= v.kv_usage:
            return f"KV cache {load.kv_usage:.0%} full (veto at {v.kv_usage:.0%})"
        return None

    def filter(self, candidates: Sequence[str]) -> list[str]:
        """The candidates not overloaded; all of them when every one is."""
        keep = [c for c in candidates if self.overloaded(c) is None]
        if not keep:
            return list(candidates)
        self.vetoes += len(candidates) - len(keep)
        return keep

    def forget(self, instance: str) -> None:
        """`instance` left the fleet."""
        for table in (self.loads, self.scraped_at, self.last_good, self.errors):
            table.pop(instance, None)

    def view(self, instance: str) -> dict[str, Any] | None:
        load = self.loads.get(instance)
        if load is None:
            return None
        return {
            "requests_waiting": load.waiting,
            "requests_running": load.running,
            "kv_cache_usage": load.kv_usage,
            "overloaded": self.overloaded(instance),
            "scraped_at": self.scraped_at.get(instance),
        }

    def reported(self) -> dict[str, Any]:
        """The engines' own prompt-token accounting, per instance and summed."""
        per: dict[str, Any] = {}
        total_src: dict[str, float] = {}
        total_cached: dict[str, float] = {}
        for instance, load in self.loads.items():
            per[instance] = {
                "prompt_tokens_by_source": dict(load.prompt_tokens_by_source),
                "cached_tokens_by_source": dict(load.cached_tokens_by_source),
            }
            for k, v in load.prompt_tokens_by_source.items():
                total_src[k] = total_src.get(k, 0.0) + v
            for k, v in load.cached_tokens_by_source.items():
                total_cached[k] = total_cached.get(k, 0.0) + v
        prompt = sum(total_src.values())
        hit = total_src.get("local_cache_hit", 0.0) + total_src.get("external_kv_transfer", 0.0)
        return {
            "instances": per,
            "prompt_tokens_by_source": total_src,
            "cached_tokens_by_source": total_cached,
            "cached_share": hit / prompt if prompt else None,
            "vetoed_candidates": self.vetoes,
        }


async def scrape(pages: EnginePages, inst: InstanceSettings, timeout_s: float) -> EngineLoad | str:
    """The instance's load, or why there is none. `timeout_s` bounds the whole exchange, so
    one engine never stalls every instance's scrape."""
    engine = inst.adapter
    deadline = time.monotonic() + timeout_s
    # the page of the load's series; where an engine serves no such page (another version,
    # a proxy in front), its whole metrics page
    for path in dict.fromkeys((engine.load_path, engine.metrics_path)):
        try:
            resp = await pages.get(f"{inst.url}{path}", max(0.01, deadline - time.monotonic()))
        except PageUnavailable as exc:
            return f"{path}: {exc}"
        load = engine.load(resp.text) if resp.status_code == 200 else None
        if load is not None and not load.empty:
            return load
    if resp.status_code != 200:
        return f"{path} answered {resp.status_code}"
    return f"{path}: none of the engine's load series"  # not a page of its kind


async def run_scraper(
    loads: EngineLoads,
    pages: EnginePages,
    instances: Any,
    *,
    interval_s: float,
    timeout_s: float,
) -> None:
    """Scrape every instance (`instances()` -> the fleet now) each interval, forever."""
    while True:
        started = time.monotonic()
        fleet = list(instances())
        results = await asyncio.gather(
            *(scrape(pages, i, timeout_s) for i in fleet), return_exceptions=True
        )
        for inst, result in zip(fleet, results, strict=True):
            if isinstance(result, EngineLoad):
                loads.update(inst.id, result)
            else:
                why = result if isinstance(result, str) else f"{type(result).__name__}: {result}"
                loads.update(inst.id, None, why)
        for gone in (set(loads.loads) | set(loads.errors)) - {i.id for i in fleet}:
            loads.forget(gone)
        await asyncio.sleep(max(0.05, interval_s - (time.monotonic() - started)))


def start_engine_load(
    settings: Settings, health: HealthChecker, registry: CollectorRegistry, life: Lifetime
) -> EngineLoads | None:
    """From the lifespan: scrape the engines, veto overloaded ones (engine_metrics); None
    when it is off."""
    cfg = settings.engine_metrics
    if not cfg.enabled:
        return None
    loads = EngineLoads(Veto(cfg.veto_waiting, cfg.veto_kv_usage), EngineLoadGauges(registry))
    health.candidate_filters.append(loads.filter)
    # a pool of its own, as the health checks have: requests cancelled or stuck in the
    # shared client (hints, /tokenize) must never stall the scrapes the veto depends on
    timeout_s = 2 * max(settings.health.timeout_s, 1.0)
    pages = EnginePages(max_connections=max(16, 2 * len(settings.instances)), timeout_s=timeout_s)
    life.closers.append(pages.aclose)
    life.spawn(
        run_scraper(loads, pages, health.instances, interval_s=cfg.interval_s, timeout_s=timeout_s),
        "engine-load",
    )
    return loads
