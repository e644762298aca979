"""The one trait every policy implements, the per-instance view policies read, and the registry.

A policy is pure: given a request and a snapshot of each candidate instance (what it holds of
the request's prefix, by tier, and how loaded it is) it returns a `Decision`. It may keep its
own small state (a round-robin cursor, a calibrated cost model) but does no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from router.types import Decision, RouteRequest, Tier

_NOTHING: Mapping[Tier, int] = MappingProxyType({})


class InstanceView(NamedTuple):
    """One candidate instance at decision time. (A named tuple: the router builds one per
    candidate per decision, and a tuple is the cheapest immutable record to build.)"""

    id: str
    in_flight: int = 0  # requests routed there and not finished (all gateway replicas)
    # prompt tokens routed there to compute (not predicted cached) whose first token is pending
    queued_prefill_tokens: int = 0
    matched_blocks: Mapping[Tier, int] = _NOTHING  # leading blocks, by tier
    cached_blocks_total: int = 0  # blocks the index believes it holds in all (tree size)

    def matched_total(self) -> int:
        return sum(self.matched_blocks.values())


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to a routed request: feeds calibration (the ttft policy's cost model)."""

    instance: str
    prompt_tokens: int
    predicted_cached_tokens: int
    ttft_s: float | None  # None when the request failed before its first token
    reported_cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    loaded_tokens_by_tier: Mapping[Tier, int] = field(default_factory=dict)


class Policy(Protocol):
    """Chooses an instance for a request among healthy candidates (never empty).

    Optional methods the router and gateway call when a policy has them:
    `on_dispatch(request, instance, computed_tokens)` (where a request was actually sent,
    the choice or a fallback, and the prompt tokens it computes there as predicted),
    `set_bandwidths(instance, {tier: bytes/s})`, `set_kv_capacity(instance, tokens)`,
    `stats()`, and `preview(request, candidates)`: the decision `choose` would make, changing
    no state (explain's dry run; a policy whose `choose` changes nothing needs none)."""

    name: str

    def choose(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> Decision: ...

    def observe(self, outcome: Outcome) -> None:
        """Learn from a finished request. Policies that learn nothing do nothing."""
        ...


PolicyFactory = Callable[..., Policy]


class PolicyRegistry:
    """Name -> factory. Built by `default_registry()`; no module-level state."""

    def __init__(self) -> None:
        self._factories: dict[str, PolicyFactory] = {}

    def register(self, name: str, factory: PolicyFactory) -> None:
        if name in self._factories:
            raise ValueError(f"policy {name!r} is already registered")
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def create(self, name: str, **params: Any) -> Policy:
        try:
            factory = self._factories[name]
        except KeyError:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(self.names())}") from None
        return factory(**params)
