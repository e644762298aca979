"""Warming a session's prompt before the player speaks (`POST /v1/warm`, issue 22 item 1).

`Warmer.warm(parsed)` routes the request exactly as the proxy would (`RequestPipeline.decide`,
which binds the session to the chosen instance; a warm the instance must refuse is refused
from a preview, before anything is bound), then makes the KV of the prompt's full
blocks resident there the cheapest way the prefix index knows of:
- `held`: the index says the instance's engine cache (HBM) holds them: nothing to do;
- `tierd`: the rest of the run is held by the instance's tierd (host memory, the array, a
  snapshot): a prefetch hint, waited for (bounded by `warm.tierd_wait_s`);
- `engine`: otherwise a one-token request to the engine (`max_tokens: 1`, never streamed,
  its output discarded) computes them; the engine's cache keeps them.

A warm is the lowest-priority work (gateway/config/warm.py `WarmSettings`): work that needs
the engine runs only while the instance is quiet (fewer than `max_real_in_flight` real
requests in flight here, at most `max_engine_waiting` waiting in the engine, fewer than
`max_per_instance` warms), else a 429 with Retry-After. Its engine request gives way to
every real request that begins on the instance and goes on after their prefills
(gateway/pipeline/warm_engine.py).
Every warm is counted in `warmgate_warm_total{source,outcome}` (a warm that gave way also
counts each `yielded` and each `resumed`) and in `stats()` (the admin stats and operator
page).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter as Tally
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from prometheus_client import CollectorRegistry, Counter

from gateway.config.settings import Settings
from gateway.errors import OpenAIError
from gateway.fleet.engine_load import EngineLoads
from gateway.fleet.health import HealthChecker
from gateway.pipeline.decide import RequestPipeline, Routed
from gateway.pipeline.parse import ParsedRequest
from gateway.pipeline.prefetch import PrefetchHints
from gateway.pipeline.warm_engine import EngineWarm, EngineWarms, deferred
from gateway.pipeline.world_replicate import WorldReplicator
from gateway.upstream.inflight import Inflight
from router.router import Router
from router.types import RouteRequest

log = logging.getLogger("warmgate.warm")

Source = Literal["held", "tierd", "engine"]


def _warmable_tokens(rr: RouteRequest) -> int:
    """The prompt's full blocks, in tokens (the last token is always computed)."""
    bt = rr.block_tokens
    return max(0, (rr.prompt_tokens - 1) // bt * bt) if bt > 0 else 0


@dataclass(frozen=True, slots=True)
class WarmResult:
    instance: str
    prompt_tokens: int
    cached_tokens: int  # before warming
    warmed_tokens: int
    source: Source
    ms: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "warmed_tokens": self.warmed_tokens,
            "source": self.source,
            "ms": round(self.ms, 3),
        }


class Warmer:
    """The gateway's warms (see module docstring), built once in the app's lifespan."""

    def __init__(
        self,
        settings: Settings,
        pipeline: RequestPipeline,
        router: Router,
        health: HealthChecker,
        inflight: Inflight,
        prefetch: PrefetchHints,
        client: httpx.AsyncClient,
        registry: CollectorRegistry,
        engine_load: EngineLoads | None = None,
    ) -> None:
        self.settings = settings
        self.config = settings.warm
        self.pipeline = pipeline
        self.router = router
        self.health = health
        self.inflight = inflight
        self.prefetch = prefetch
        self.client = client
        self.engine_load = engine_load
        self.total = Counter(
            "warmgate_warm",
            "Warms (POST /v1/warm) by source (held, tierd, engine) and outcome "
            "(ok, deferred, yielded, resumed, failed).",
            ["source", "outcome"],
            registry=registry,
        )
        self.tally: Tally[tuple[str, str]] = Tally()
        self.engine = EngineWarms(
            self.config, health, inflight, client, lambda outcome: self._count("engine", outcome)
        )
        self._restoring: Tally[str] = Tally()  # tierd restores
        # world versions (issue 22, item 4): new versions warmed on the zone's other instances
        self.world: WorldReplicator | None = None
        if self.config.world.enabled:
            self.world = WorldReplicator(
                settings, pipeline, health.candidates_for, prefetch.clients, self.warm_on, registry
            )
            router.dispatch_observers.append(self.world.dispatched)

    def note(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> None:
        """A completion request or warm about to be routed (world versions' input)."""
        if self.world is not None:
            self.world.note(parsed, headers)

    # -- the warm ------------------------------------------------------------------------

    async def warm(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> WarmResult:
        """Warm `parsed`'s prompt on the instance its session is routed (and bound) to;
        raises the 429 when deferred, a 502 when the engine or tierd failed."""
        started = time.monotonic()
        # Previewed first: a warm the instance must refuse (it needs the engine, which is
        # busy) is refused before the session is bound there. Bound, the player's line would
        # follow the refused warm to the busy instance, and in a raid every warm of a zone
        # sees the same loads: their sessions herd onto one instance (bench cluster
        # --hints-ab, 2026-12-03: first-line p99 2.6x that without warms).
        preview = await self.pipeline.decide(parsed, dry_run=True)
        if self._needs_engine(preview):
            why = self._admission(preview.decision.instance)
            if why is not None:
                self._count("engine", "deferred")
                raise deferred(preview.decision.instance, why, self.config.retry_after_s)
        routed = await self.pipeline.decide(parsed, dry_run=False, route=preview.route)
        decision, rr = routed.decision, routed.route
        instance = decision.instance
        by_tier = decision.cached_tokens_by_tier
        held = by_tier.get("hbm", 0)
        full = _warmable_tokens(rr)
        if held >= full:
            self._count("held", "ok")
            return WarmResult(instance, rr.prompt_tokens, held, 0, "held", _ms(started))
        if sum(by_tier.values()) >= full and routed.prefetch is not None:
            restored = await self._restore(routed)
            return WarmResult(instance, rr.prompt_tokens, held, restored, "tierd", _ms(started))
        answer = await self._compute(parsed, routed, headers)
        usage = answer.get("usage") if isinstance(answer, dict) else None
        prompt = _int(usage, "prompt_tokens", rr.prompt_tokens)
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        cached = _int(details, "cached_tokens", 0)
        return WarmResult(instance, prompt, cached, max(0, prompt - cached), "engine", _ms(started))

    @staticmethod
    def _needs_engine(routed: Routed) -> bool:
        """Neither held in HBM nor restorable from tierd: the warm would compute."""
        full, by_tier = _warmable_tokens(routed.route), routed.decision.cached_tokens_by_tier
        if by_tier.get("hbm", 0) >= full:
            return False
        return not (sum(by_tier.values()) >= full and routed.prefetch is not None)

    async def warm_on(self, parsed: ParsedRequest, instance: str) -> WarmResult:
        """Warm `parsed` (no session: nobody is bound) on `instance`, whatever the policy
        would choose: a world version's replication. The same admission as `warm`."""
        started = time.monotonic()
        rr = await self.pipeline.route_request(parsed, [instance])
        decision = self.router.explain(rr, [instance])
        held = decision.cached_tokens_by_tier.get("hbm", 0)
        full = _warmable_tokens(rr)
        if held >= full:
            self._count("held", "ok")
            return WarmResult(instance, rr.prompt_tokens, held, 0, "held", _ms(started))
        routed = Routed(rr, decision, (instance,), instance, None, None, None)
        answer = await self._compute(parsed, routed, {})
        usage = _usage_details(answer)
        prompt = _int(answer.get("usage"), "prompt_tokens", rr.prompt_tokens)
        cached = _int(usage, "cached_tokens", 0)
        return WarmResult(instance, prompt, cached, max(0, prompt - cached), "engine", _ms(started))

    async def _restore(self, routed: Routed) -> int:
        plan = routed.prefetch
        assert plan is not None
        instance = plan.instance
        if self.in_flight(instance) >= self.config.max_per_instance:
            self._count("tierd", "deferred")
            raise deferred(instance, "has warms in flight", self.config.retry_after_s)
        wait_s = self.config.tierd_wait_s
        self._restoring[instance] += 1
        try:
            await self.prefetch.restore(instance, plan.chain, wait_s, plan.session)
        except Exception as exc:
            self._count("tierd", "failed")
            raise OpenAIError(
                502,
                f"Warm failed: {instance}'s tierd did not restore the prompt: {exc!r}",
                type="server_error",
                code="warm_failed",
            ) from None
        finally:
            self._restoring[instance] -= 1
        self._count("tierd", "ok")
        by_tier = routed.decision.cached_tokens_by_tier
        return sum(n for label, n in by_tier.items() if label != "hbm")

    def _admission(self, instance: str) -> str | None:
        """Why the instance cannot take an engine warm now, or None."""
        load = self.engine_load.loads.get(instance) if self.engine_load is not None else None
        waiting = load.waiting if load is not None else None
        return self.config.refusal(self.in_flight(instance), self.inflight.count(instance), waiting)

    async def _compute(
        self, parsed: ParsedRequest, routed: Routed, headers: Mapping[str, str]
    ) -> dict[str, Any]:
        instance = routed.decision.instance
        why = self._admission(instance)
        if why is not None:
            self._count("engine", "deferred")
            raise deferred(instance, why, self.config.retry_after_s)
        rr, decision = routed.route, routed.decision
        self.router.on_dispatch(rr, decision, instance)
        running = EngineWarm()
        ok, cached = False, None
        try:
            answer = await self.engine.run(parsed, instance, headers, running)
            ok = True
            cached = _int(_usage_details(answer), "cached_tokens", 0)  # the engine's report
            if running.yields:  # what was cached before it is the index's view of then
                answer = _with_cached(answer, decision.cached_tokens_by_tier.get("hbm", 0))
        except OpenAIError as err:
            if not running.yields:  # one that gave way and then gave up counted `yielded`
                self._count("engine", "deferred" if err.status == 429 else "failed")
            raise
        except asyncio.CancelledError:
            self._count("engine", "failed")
            raise  # the client went away: the warm's request is cancelled with it
        finally:
            self.router.on_complete(
                rr, decision, instance, ttft_s=None, reported_cached_tokens=cached, ok=ok
            )
        self._count("engine", "ok")
        return answer

    # -- accounting ----------------------------------------------------------------------

    def _count(self, source: Source, outcome: str) -> None:
        self.total.labels(source, outcome).inc()
        self.tally[(source, outcome)] += 1

    def in_flight(self, instance: str) -> int:
        """Warms in flight on `instance` (engine and tierd)."""
        return self.engine.in_flight(instance) + self._restoring[instance]

    def stats(self) -> dict[str, Any]:
        """Warms by source and outcome, and those in flight per instance."""
        by: dict[str, dict[str, int]] = {}
        for (source, outcome), n in sorted(self.tally.items()):
            by.setdefault(source, {})[outcome] = n
        return {
            "total": sum(self.tally.values()),
            "by_source": by,
            "world": self.world.stats() if self.world is not None else None,
            "in_flight": {
                i: n
                for i in {*self.engine.instances(), *self._restoring}
                if (n := self.in_flight(i))
            },
        }


def _with_cached(answer: dict[str, Any], cached: int) -> dict[str, Any]:
    """`answer` reporting `cached` prompt tokens cached: a warm sent again after giving way
    finds its own first part cached, which was not there before it."""
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        return answer
    details = usage.get("prompt_tokens_details")
    details = dict(details) if isinstance(details, dict) else {}
    details["cached_tokens"] = min(cached, _int(details, "cached_tokens", cached))
    return {**answer, "usage": {**usage, "prompt_tokens_details": details}}


def _usage_details(answer: Mapping[str, Any]) -> Mapping[str, Any] | None:
    usage = answer.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    return details if isinstance(details, dict) else None


def _int(holder: Mapping[str, Any] | None, name: str, default: int) -> int:
    value = holder.get(name) if holder is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _ms(started: float) -> float:
    return (time.monotonic() - started) * 1000.0
