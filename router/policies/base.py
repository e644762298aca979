"""The one trait every policy implements, the per-instance view policies read, and the registry.

A policy is pure: given a request and a snapshot of each candidate instance (what it holds of
the request's prefix, by tier, and how loaded it is) it returns a `Decision`. It may keep its
own small state (a round-robin cursor, a calibrated cost model) but does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

from contracts.tiers import Tier
from router.errors import PolicyConfigError
from router.types import Decision, RouteRequest

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
    decision: Decision | None = None  # the decision this outcome is of (its handle)


class CalibrationSample(NamedTuple):
    """One calibration probe prompt on an instance (the gateway's join probe,
    gateway/fleet/calibration_probe.py): `prompt_tokens` cold tokens (unique `cache_salt`:
    nothing cached) on an instance with nothing else routed there, first token after
    `ttft_s` seconds."""

    prompt_tokens: int
    ttft_s: float


class Policy:
    """Chooses an instance for a request among healthy candidates (never empty).

    A policy subclasses this and implements `choose`; every other hook has a no-op default,
    so the router and the gateway call them unconditionally (as SMG's policy trait and
    llm-d's plugin interfaces do):
    - `preview(request, candidates)`: the decision `choose` would make, changing no state
      (explain's dry run); the default is `choose` itself, right for a policy whose `choose`
      changes nothing;
    - `on_dispatch(request, decision, instance, computed_tokens)`: where a request was
      actually sent (the choice, a session binding's redirect or a fallback) and the prompt
      tokens it computes there as predicted. A policy commits its own state here, for that
      instance, never in `choose` (the gateway may still send the request elsewhere);
      `decision.pending` carries what it needs from `choose`;
    - `observe(outcome)`: learn from a finished request (`outcome.decision` is its handle);
    - `set_bandwidths(instance, {tier label: bytes/s})` (from tierd's stats) and
      `set_kv_capacity(instance, tokens)` (from the engine's `vllm:cache_config_info`);
      the gateway discovers capacities only for a policy with `wants_kv_capacity`;
    - `calibrate(instance, samples)`: the instance's join probe measured these cold, idle
      TTFTs (`CalibrationSample`) before any routed request reached it;
    - `stats()`: what a learning policy knows, for `/admin` (None: nothing to say).
    `session_affine` says whether players' session bindings across gateway replicas apply
    (False for the session-blind baselines)."""

    name: ClassVar[str]
    session_affine: ClassVar[bool] = True
    wants_kv_capacity: ClassVar[bool] = False

    def choose(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> Decision:
        raise NotImplementedError

    def preview(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> Decision:
        return self.choose(request, candidates)

    def on_dispatch(
        self, request: RouteRequest, decision: Decision, instance: str, computed_tokens: int
    ) -> None:
        return None

    def observe(self, outcome: Outcome) -> None:
        return None

    def set_bandwidths(self, instance: str, bandwidths: Mapping[str, float]) -> None:
        return None

    def set_kv_capacity(self, instance: str, tokens: int) -> None:
        return None

    def calibrate(self, instance: str, samples: Sequence[CalibrationSample]) -> None:
        return None

    def stats(self) -> dict[str, object] | None:
        return None


class PolicyRegistry:
    """Name -> policy class (its keyword arguments are its parameters: the gateway builds
    a typed settings model from them). Built by `default_registry()`; no module-level
    state."""

    def __init__(self) -> None:
        self._classes: dict[str, type[Policy]] = {}

    def register(self, cls: type[Policy]) -> None:
        if cls.name in self._classes:
            raise PolicyConfigError(f"policy {cls.name!r} is already registered")
        self._classes[cls.name] = cls

    def names(self) -> list[str]:
        return sorted(self._classes)

    def policy_class(self, name: str) -> type[Policy]:
        try:
            return self._classes[name]
        except KeyError:
            raise PolicyConfigError(
                f"unknown policy {name!r}; known: {', '.join(self.names())}"
            ) from None

    def create(self, name: str, **params: Any) -> Policy:
        return self.policy_class(name)(**params)
