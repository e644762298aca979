"""The request pipeline: the one owner of turning a parsed request into a routing decision.

`RequestPipeline.decide(parsed, *, dry_run)` runs, in order:
1. candidates: the healthy instances serving the model (a 404 for an unknown model, a 503
   when none is healthy);
2. the route request: the prompt's block chain in the configured mode (precise from real
   tokens, else approximate), built once;
3. the session binding's lookup (replicas sharing Redis), the router's decision, and the
   binding applied to it, with nothing awaited between the decision and the binding;
4. the prefetch plan: the chain and deadline a hint to the chosen instance's tierd names.

The proxy calls it with `dry_run=False` and then dispatches; explain (`/admin/route/
explain`) calls it with `dry_run=True`: the policy previews instead of choosing, the binding
says what it would do and writes nothing, no metric moves and no hint is sent. Both see the
same decision, the binding included. The `Decision` it returns is the handle the router's
`on_dispatch`, `on_first_token` and `on_complete` (and so the policy's `observe`) take.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gateway.config.settings import Settings, hint_keys
from gateway.errors import model_not_found, no_healthy_instance
from gateway.fleet.health import HealthChecker
from gateway.observe.metrics import GatewayMetrics
from gateway.pipeline.parse import ParsedRequest, route_request
from gateway.pipeline.prefetch import PrefetchHints
from gateway.pipeline.session_bindings import SessionBindings
from gateway.pipeline.tokens import PreciseChains
from router.router import Router
from router.types import Decision, NoCandidateError, RouteRequest


@dataclass(frozen=True, slots=True)
class PrefetchPlan:
    """A hint for the chosen instance's tierd: this chain, in HBM within `deadline_s`."""

    instance: str
    chain: Sequence[int]
    deadline_s: float
    session: str | None


@dataclass(frozen=True, slots=True)
class Routed:
    """A decided request: what the router saw, what was decided, and what follows."""

    route: RouteRequest
    decision: Decision  # after the session binding
    candidates: tuple[str, ...]
    policy_choice: str  # the policy's own pick (the binding may have redirected it)
    binding: str | None  # bound, kept, redirected, moved; None when bindings do not apply
    bound_instance: str | None  # what the binding said before this request
    prefetch: PrefetchPlan | None

    def attempt_order(self) -> list[str]:
        """The decided instance, then its fallbacks among the candidates, each once."""
        allowed = set(self.candidates)
        order = [self.decision.instance, *(f for f in self.decision.fallbacks if f in allowed)]
        return list(dict.fromkeys(order))


class RequestPipeline:
    """Built once in the app's lifespan from the app's parts (see module docstring)."""

    def __init__(
        self,
        settings: Settings,
        health: HealthChecker,
        router: Router,
        metrics: GatewayMetrics,
        prefetch: PrefetchHints,
        *,
        precise: PreciseChains | None,
        bindings: SessionBindings | None,
    ) -> None:
        self.settings = settings
        self.health = health
        self.router = router
        self.metrics = metrics
        self.prefetch = prefetch
        self.precise = precise
        self.bindings = bindings

    async def decide(
        self,
        parsed: ParsedRequest,
        *,
        dry_run: bool,
        among: Collection[str] | None = None,
        route: RouteRequest | None = None,
    ) -> Routed:
        """`among`: the only instances that may be chosen (the subset a data plane offers
        the endpoint picker, gateway/epp/), None for every healthy one. `route`: the request
        as a decision moments ago saw it (a warm's preview), not tokenized again."""
        if parsed.model not in self.health.known_models():
            raise model_not_found(parsed.model)
        candidates = self.health.candidates_for(parsed.model)
        if among is not None:
            candidates = [c for c in candidates if c in among]
        retry_after = self.settings.retry_after_s
        if not candidates:
            raise no_healthy_instance(parsed.model, retry_after)
        rr = route if route is not None else await self.route_request(parsed, candidates)
        bindings = self.bindings
        bound = await bindings.lookup(rr, dry_run=dry_run) if bindings is not None else None
        # from here to the binding nothing is awaited: no other request slips in between
        try:
            chosen = (
                self.router.explain(rr, candidates)
                if dry_run
                else self.router.route(rr, candidates)
            )
        except NoCandidateError:
            raise no_healthy_instance(parsed.model, retry_after) from None
        decision, binding = chosen, None
        if bindings is not None:
            decision, binding = bindings.bind(rr, chosen, candidates, bound, dry_run=dry_run)
        if not dry_run:
            self.metrics.decisions.labels(decision.instance, decision.policy).inc()
        return Routed(
            route=rr,
            decision=decision,
            candidates=tuple(candidates),
            policy_choice=chosen.instance,
            binding=binding,
            bound_instance=bound,
            prefetch=self._prefetch_plan(parsed, rr, decision.instance),
        )

    async def route_request(self, parsed: ParsedRequest, candidates: Sequence[str]) -> RouteRequest:
        """The request as the router sees it, in the configured mode (precise falls back to
        approximate when tokens cannot be had)."""
        if self.precise is not None:
            rr = await self.precise.route_request(parsed, candidates)
            if rr is not None:
                return rr
        return route_request(parsed, self.settings.routing)

    def _prefetch_plan(
        self, parsed: ParsedRequest, rr: RouteRequest, instance: str
    ) -> PrefetchPlan | None:
        if not self.prefetch.wants(instance):
            return None
        # The keys tierd holds (`tiers.hint_keys`, by default the routing mode's): tierd's
        # vLLM connector keys slices by the engine's own block hashes (contracts.slices),
        # precise mode's chain; the simulated engine's go by the approximate blocks.
        if self.precise is None or hint_keys(self.settings) == "engine":
            chain: Sequence[int] = rr.block_hashes
        else:
            chain = route_request(parsed, self.settings.routing).block_hashes
        tiers = self.settings.tiers
        return PrefetchPlan(instance, list(chain), tiers.prefetch_deadline_s, parsed.session_key)

    def send_prefetch(self, routed: Routed) -> asyncio.Task[None] | None:
        """Start the hint in the background; its task when one was started (its first step,
        which writes it, runs on the loop's next turn). With `tiers.prefetch_hold_s` the
        task ends when tierd has read the chain into host memory (`hold_for_prefetch`)."""
        plan = routed.prefetch
        if plan is None:
            return None
        wait = self.settings.tiers.prefetch_hold_s > 0
        return self.prefetch.hint(
            plan.instance, plan.chain, plan.deadline_s, plan.session, wait=wait
        )

    async def hold_for_prefetch(self, hint: asyncio.Task[None] | None) -> None:
        """Before the request goes: one turn of the loop, which writes the hint to tierd
        ahead of the request whose lookup it races; with `tiers.prefetch_hold_s`, until
        tierd has read the chain into host memory, at most that long (the hint goes on)."""
        if hint is None:
            return
        hold = self.settings.tiers.prefetch_hold_s
        if hold > 0:
            await asyncio.wait((hint,), timeout=hold)
        else:
            await asyncio.sleep(0)
