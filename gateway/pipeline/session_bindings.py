"""Session bindings across gateway replicas: a player's turns stay on one instance.

With the Redis backend, a player's session key is bound to an instance set-if-absent, so
whichever replica routes a turn, the player lands where their KV is. `lookup()` runs before
routing (local cache, else one timeout-bounded GET that refreshes the TTL; nothing while
Redis is down); `bind()` runs after routing and is synchronous, so no other request can slip
in between a decision and its dispatch (awaiting there made concurrent first turns herd onto
one instance); new bindings and moves are written in the background. A binding yields when
its instance is not a candidate (unhealthy) or clearly overloaded (`overload_factor` x the
mean in-flight + 4); then it moves, compare-and-set. A single replica (memory backend) leaves
routing to its policy, which sees everything already; so do policies that are not
`session_affine` (the session-blind baselines round_robin, least_load).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from gateway.config.settings import StateSettings
from gateway.pipeline.binding_rule import OVERLOAD_FACTOR, overloaded
from gateway.pipeline.state_metrics import StateMetrics
from router.router import Router
from router.state.base import StateUnavailableError
from router.state.sync import StateSync
from router.types import Decision, RouteRequest, ordered_fallbacks


class SessionBindings:
    """Players' session bindings across gateway replicas, over the shared state's sync."""

    def __init__(
        self,
        sync: StateSync,
        router: Router,
        settings: StateSettings,
        metrics: StateMetrics,
        *,
        binding_cache_s: float = 2.0,
        binding_cache_max: int = 100_000,
        overload_factor: float = OVERLOAD_FACTOR,
        max_pending: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sync = sync
        self.store = sync.store
        self.router = router
        self.settings = settings
        self.metrics = metrics
        self.binding_cache_s = binding_cache_s
        self.binding_cache_max = binding_cache_max
        self.overload_factor = overload_factor
        self.max_pending = max_pending
        self._clock = clock
        self._cache: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._pending: set[asyncio.Task[None]] = set()

    async def readiness(self) -> dict[str, Any]:
        # An outage degrades routing to local state; it does not stop serving.
        return {**self.sync.status(), "required": False}

    # -- local binding cache -------------------------------------------------------------

    def _cached(self, key: str) -> str | None:
        hit = self._cache.get(key)
        if hit is None or hit[1] <= self._clock():
            return None
        return hit[0]

    def _remember(self, key: str, instance: str) -> None:
        self._cache[key] = (instance, self._clock() + self.binding_cache_s)
        self._cache.move_to_end(key)
        while len(self._cache) > self.binding_cache_max:
            self._cache.popitem(last=False)

    def _overloaded(self, instance: str, candidates: Sequence[str]) -> bool:
        loads = [self.router.load.view(c)[0] for c in candidates]
        return overloaded(self.router.load.view(instance)[0], loads, self.overload_factor)

    def _affine(self, rr: RouteRequest) -> str | None:
        """The session key when bindings apply to this request (see the module docstring)."""
        if (
            not rr.session_key
            or self.store.backend == "memory"
            or not self.router.policy.session_affine
        ):
            return None
        return rr.session_key

    async def binding_of(self, key: str) -> dict[str, Any]:
        """For the admin "where is this player" view: the player's binding and where it was
        read (the local cache, else the store, without refreshing its TTL)."""
        cached = self._cached(key)
        if cached is not None:
            return {"bound_instance": cached, "source": "cache"}
        if self.store.backend == "memory":
            return {"bound_instance": None, "source": "none (single replica: the policy decides)"}
        try:
            bound = await self.sync.call(
                "get_session",
                lambda: self.store.get_session(key, self.settings.session_ttl_s),
                self.sync.config.call_timeout_s,
            )
        except StateUnavailableError as exc:
            return {"bound_instance": None, "source": f"store unavailable: {exc}"}
        return {"bound_instance": bound, "source": "store"}

    # -- the two calls around routing ----------------------------------------------------

    async def lookup(self, rr: RouteRequest, *, dry_run: bool = False) -> str | None:
        """Before routing: the player's bound instance, from the local cache or one
        timeout-bounded call (which refreshes the binding's TTL). None when unbound or when
        the store is down. `dry_run` (explain) leaves the local cache and counters alone."""
        key = self._affine(rr)
        if key is None:
            return None
        bound = self._cached(key)
        if bound is not None or not self.sync.up:
            return bound
        try:
            bound = await self.sync.call(
                "get_session",
                lambda: self.store.get_session(key, self.settings.session_ttl_s),
                self.sync.config.call_timeout_s,
            )
        except StateUnavailableError:
            if not dry_run:
                self.metrics.bindings.labels("unavailable").inc()
            return None
        if bound is not None and not dry_run:
            self._remember(key, bound)
        return bound

    def bind(
        self,
        rr: RouteRequest,
        decision: Decision,
        candidates: Sequence[str],
        bound: str | None,
        *,
        dry_run: bool = False,
    ) -> tuple[Decision, str | None]:
        """After routing, synchronously, with the binding `lookup()` returned: follow it, or
        record a new one in the background (set-if-absent: if another replica bound the
        player first, its choice is adopted from the next turn on). Returns the decision to
        dispatch and what the binding did (bound, kept, redirected, moved; None when
        bindings do not apply). `dry_run` (explain) says the same and writes nothing."""
        key = self._affine(rr)
        if key is None or len(candidates) < 2:
            return decision, None
        if bound is None:
            outcome = "bound"
        elif bound == decision.instance:
            outcome = "kept"
        elif bound in candidates and not self._overloaded(bound, candidates):
            outcome = "redirected"
        else:  # the bound instance is unhealthy or overloaded: move the player (CAS)
            outcome = "moved"
        if not dry_run:
            self.metrics.bindings.labels(outcome).inc()
            if outcome == "bound":
                self._remember(key, decision.instance)  # provisional until the store answers
                self._background(self._bind_new(key, decision.instance))
            elif outcome == "moved" and bound is not None:
                self._remember(key, decision.instance)
                self._background(self._move(key, bound, decision.instance))
        if outcome == "redirected" and bound is not None:
            return _redirect(decision, bound), outcome
        return decision, outcome

    # -- background writes ---------------------------------------------------------------

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        if len(self._pending) >= self.max_pending or not self.sync.up:
            coro.close()  # the store is slow or down: the binding waits for a later turn
            return
        task = asyncio.create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _bind_new(self, key: str, instance: str) -> None:
        ttl, t = self.settings.session_ttl_s, self.sync.config.call_timeout_s
        with contextlib.suppress(StateUnavailableError):
            winner = await self.sync.call(
                "bind_session", lambda: self.store.bind_session(key, instance, ttl), t
            )
            self._remember(key, winner)

    async def _move(self, key: str, old: str, new: str) -> None:
        ttl, t = self.settings.session_ttl_s, self.sync.config.call_timeout_s
        with contextlib.suppress(StateUnavailableError):
            moved = await self.sync.call(
                "rebind_session", lambda: self.store.rebind_session(key, old, new, ttl), t
            )
            self._remember(key, moved)

    async def close(self) -> None:
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        await self.store.close()


def _redirect(decision: Decision, instance: str) -> Decision:
    score = next((c for c in decision.candidates if c.instance == instance), None)
    by_tier = dict(score.cached_tokens_by_tier) if score is not None else {}
    return dataclasses.replace(
        decision,
        instance=instance,
        reason=f"session binding (policy chose {decision.instance}: {decision.reason})",
        cached_tokens=sum(by_tier.values()),
        cached_tokens_by_tier=by_tier,
        predicted_ttft_s=score.predicted_ttft_s if score is not None else None,
        fallbacks=ordered_fallbacks(instance, [decision.instance, *decision.fallbacks]),
    )
