"""Health of each instance: a background loop GETs every instance's health route (its engine
kind's, `Engine.health_path`: `/health`) each interval;
`failure_threshold` consecutive failures take it out of the candidate set,
`success_threshold` consecutive successes bring it back (a newly configured instance joins
on its first good check). Failures the proxy sees (connection
refused, 5xx) count too, so a dead instance leaves the set without waiting for the loop.
Instances configured without a model list get theirs from the engine's models route
(`Engine.models_path`, `/v1/models`, read by `Engine.served_models`).

The set of instances changes at runtime (`gateway.fleet.runtime`): `add` and `remove` them, and
`set_draining` keeps an instance checked but out of every candidate set while its in-flight
requests finish. A removed instance's URL stays resolvable, so a request already routed
there can still fail over or finish."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from contracts.errors import UpstreamError
from gateway.config.settings import HealthSettings, InstanceSettings
from gateway.engine.base import Engine
from gateway.fleet.engine_pages import EnginePages, PageUnavailable
from gateway.observe.metrics import GatewayMetrics

log = logging.getLogger("warmgate.health")

HealthState = Literal["unknown", "healthy", "unhealthy"]


class ModelListError(UpstreamError, ValueError):
    """An engine's `/v1/models` answer names no model."""


@dataclass
class InstanceHealth:
    """What the gateway believes about one instance's health, and why."""

    id: str
    state: HealthState = "unknown"
    reason: str = "not checked yet"
    since: float = field(default_factory=time.time)  # wall time of the last state change
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    last_check: float | None = None  # wall time
    last_latency_s: float | None = None
    discovered_models: list[str] = field(default_factory=list)
    half_open: bool = False  # back from unhealthy, on trial until a request succeeds

    @property
    def healthy(self) -> bool:
        return self.state == "healthy"

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "reason": self.reason,
            "since": self.since,
            "consecutive_failures": self.consecutive_failures,
            "consecutive_successes": self.consecutive_successes,
            "last_check": self.last_check,
            "last_latency_s": self.last_latency_s,
            "breaker": "open"
            if self.state == "unhealthy"
            else "half_open"
            if self.half_open
            else "closed",
        }


class HealthChecker:
    """Owns the health state of every configured instance."""

    def __init__(
        self,
        instances: Sequence[InstanceSettings],
        settings: HealthSettings,
        pages: EnginePages,
        metrics: GatewayMetrics,
    ) -> None:
        self._instances = {i.id: i for i in instances}
        self._retired: dict[str, InstanceSettings] = {}  # removed, still resolvable by URL
        self.draining: set[str] = set()
        # called with (instance, reason) when health checks open its breaker
        self.on_unhealthy: list[Callable[[str, str], None]] = []
        self._settings = settings
        self._pages = pages
        self._metrics = metrics
        self.health: dict[str, InstanceHealth] = {i.id: InstanceHealth(i.id) for i in instances}
        # called as listener(instance, old_state, new_state) on every change (sync, short):
        # the KV view of an instance that went away must not outlive it (gateway.fleet.kv_resync)
        self.listeners: list[Callable[[str, HealthState, HealthState], None]] = []
        # narrow a model's healthy candidates (gateway.fleet.engine_load's overload veto)
        self.candidate_filters: list[Callable[[list[str]], list[str]]] = []
        for i in instances:
            metrics.instance_healthy.labels(i.id).set(0)

    # --- the set of instances (changed at runtime by gateway.fleet.runtime) ----------------------
    def instances(self) -> list[InstanceSettings]:
        return list(self._instances.values())

    def spec(self, instance_id: str) -> InstanceSettings | None:
        return self._instances.get(instance_id)

    def add(self, inst: InstanceSettings) -> None:
        """Start checking `inst` (it joins the candidates on its first good check)."""
        self._instances[inst.id] = inst
        self._retired.pop(inst.id, None)
        self.draining.discard(inst.id)
        self.health[inst.id] = InstanceHealth(inst.id)
        self._metrics.instance_healthy.labels(inst.id).set(0)

    def remove(self, instance_id: str) -> None:
        inst = self._instances.pop(instance_id, None)
        if inst is None:
            return
        self._retired[instance_id] = inst
        self.health.pop(instance_id, None)
        self.draining.discard(instance_id)
        with contextlib.suppress(KeyError):  # never labelled yet
            self._metrics.instance_healthy.remove(instance_id)

    def set_draining(self, instance_id: str, draining: bool) -> None:
        """A draining instance is checked as before but is nobody's candidate."""
        if draining and instance_id in self._instances:
            self.draining.add(instance_id)
        else:
            self.draining.discard(instance_id)

    # --- queries -------------------------------------------------------------------------
    def instance_url(self, instance_id: str) -> str:
        inst = self._instances.get(instance_id) or self._retired[instance_id]
        return inst.url

    def engine_of(self, instance_id: str) -> Engine:
        """The instance's engine kind (a removed instance's too, as `instance_url`)."""
        inst = self._instances.get(instance_id) or self._retired[instance_id]
        return inst.adapter

    def healthy_ids(self) -> list[str]:
        return [i for i, h in self.health.items() if h.healthy and i not in self.draining]

    def models_of(self, instance_id: str) -> list[str]:
        inst = self._instances.get(instance_id)
        if inst is None:
            return []
        if inst.models:
            return list(inst.models)
        return list(self.health[instance_id].discovered_models)

    def known_models(self) -> set[str]:
        """Every model any instance (healthy or not) is known to serve."""
        return {m for i in self._instances for m in self.models_of(i)}

    def healthy_models(self) -> list[str]:
        seen: dict[str, None] = {}
        for i in self.healthy_ids():
            for m in self.models_of(i):
                seen.setdefault(m, None)
        return list(seen)

    def candidates_for(self, model: str) -> list[str]:
        out = [i for i in self.healthy_ids() if model in self.models_of(i)]
        for keep in self.candidate_filters:  # e.g. the engines' overload veto
            out = keep(out)
        return out

    # --- transitions ---------------------------------------------------------------------
    def record_success(self, instance_id: str, latency_s: float | None = None) -> None:
        h = self.health.get(instance_id)
        if h is None:  # removed while it was being checked
            return
        h.consecutive_failures = 0
        h.consecutive_successes += 1
        h.last_check = time.time()
        h.last_latency_s = latency_s
        # a new instance joins on its first good check; a failed one must prove itself
        needed = 1 if h.state == "unknown" else self._settings.success_threshold
        if not h.healthy and h.consecutive_successes >= needed:
            h.half_open = h.state == "unhealthy"  # back on trial until a request succeeds
            self._set(h, "healthy", f"{h.consecutive_successes} consecutive health checks passed")

    def record_failure(self, instance_id: str, reason: str, *, probe: bool = False) -> None:
        """A failed health check (`probe`) or request. Past `failure_threshold` in a row the
        breaker opens (unhealthy); half-open (just back), one failed request opens it again.
        Only probes fail the requests in flight there: one request's failure says little
        about the streams the instance is serving well."""
        h = self.health.get(instance_id)
        if h is None:  # removed meanwhile (a request still in flight there failed)
            return
        h.consecutive_successes = 0
        h.consecutive_failures += 1
        h.last_check = time.time()
        needed = 1 if h.half_open and not probe else self._settings.failure_threshold
        if h.state != "unhealthy" and h.consecutive_failures >= needed:
            why = f"{h.consecutive_failures} consecutive failures; last: {reason}"
            if h.half_open and not probe:
                why = f"failed while half-open: {reason}"
            h.half_open = False
            self._set(h, "unhealthy", why)
            if probe:
                for listener in self.on_unhealthy:
                    listener(instance_id, why)
        elif h.state == "unhealthy":
            h.reason = f"{h.consecutive_failures} consecutive failures; last: {reason}"

    def record_served(self, instance_id: str) -> None:
        """A request succeeded there: a half-open breaker closes."""
        h = self.health.get(instance_id)
        if h is not None and h.half_open:
            h.half_open = False
            log.info("instance %s: breaker closed (a request succeeded)", instance_id)

    def _set(self, h: InstanceHealth, state: HealthState, reason: str) -> None:
        log.info(
            "instance %s is now %s (%s)",
            h.id,
            state,
            reason,
            extra={"instance": h.id, "health_state": state},
        )
        old = h.state
        h.state, h.reason, h.since = state, reason, time.time()
        self._metrics.instance_healthy.labels(h.id).set(1 if state == "healthy" else 0)
        for listener in self.listeners:
            try:
                listener(h.id, old, state)
            except Exception:  # a listener's failure must not stop health tracking
                log.exception("health listener failed for %s", h.id)

    # --- checking ------------------------------------------------------------------------
    async def check(self, instance_id: str) -> None:
        inst = self._instances.get(instance_id)
        if inst is None:
            return
        timeout = self._settings.timeout_s
        path = inst.adapter.health_path
        started = time.monotonic()
        try:
            resp = await self._pages.get(f"{inst.url}{path}", timeout)
        except PageUnavailable as exc:
            self.record_failure(instance_id, f"{path}: {exc}", probe=True)
            return
        if resp.status_code != 200:
            self.record_failure(instance_id, f"{path} answered {resp.status_code}", probe=True)
            return
        h = self.health.get(instance_id)
        if h is not None and not inst.models and not h.discovered_models:
            try:
                await self._discover_models(inst, timeout)
            except (PageUnavailable, ValueError) as exc:
                why = f"{inst.adapter.models_path}: {type(exc).__name__}: {exc}"
                self.record_failure(instance_id, why, probe=True)
                return
        self.record_success(instance_id, time.monotonic() - started)

    async def _discover_models(self, inst: InstanceSettings, timeout_s: float) -> None:
        engine = inst.adapter
        resp = await self._pages.get(f"{inst.url}{engine.models_path}", timeout_s)
        if resp.status_code != 200:
            raise ModelListError(f"answered {resp.status_code}")
        models = engine.served_models(resp.json())
        if models is None:
            raise ModelListError("no model list in the answer")
        if not models:
            raise ModelListError("the instance serves no model")
        h = self.health.get(inst.id)
        if h is not None:
            h.discovered_models = models

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(i) for i in list(self._instances)))

    async def run(self) -> None:
        """Check every instance each interval, forever (cancelled at shutdown)."""
        while True:
            started = time.monotonic()
            try:
                await self.check_all()
            except Exception as exc:  # one bad round never stops the loop
                log.warning("health round failed: %r", exc)
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(0.0, self._settings.interval_s - elapsed))
