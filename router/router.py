"""The router: glues the prefix index, the load view and a policy together.

`route()` is a pure decision: it asks the index how much of the request's block chain each
candidate holds (by tier), reads the load view, and lets the policy choose. The lifecycle
calls that follow a decision change state: `on_dispatch` (load +1, its predicted uncached
tokens join the instance's prefill queue, predict-on-route insert of the chain on the
chosen instance, TTL'd), `on_first_token` (prefill done: they leave the queue),
`on_complete` (load -1, the policy observes the outcome, predicted-vs-reported cached-token
accounting). The same object runs in the gateway and in the cluster simulator.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from contracts.tiers import Tier
from router.index import PrefixIndex
from router.load import LoadView
from router.policies.base import InstanceView, Outcome, Policy
from router.types import Decision, NoCandidateError, RouteRequest

_TIER_BY_LABEL = {t.label: t for t in Tier}
DEFAULT_SESSIONS_KEPT = 100_000
_Decide = Callable[[RouteRequest, Sequence[InstanceView]], Decision]


@dataclass(slots=True)
class _SessionSeen:
    instance: str
    hashes: Sequence[int]
    block_tokens: int
    routed_at: float
    reason: str


@dataclass(slots=True)
class _Totals:
    routed: int = 0
    completed: int = 0
    failed: int = 0
    predicted_cached_tokens: int = 0
    reported_cached_tokens: int = 0
    predicted_cached_tokens_when_reported: int = 0
    reports: int = 0
    prompt_tokens: int = 0


class Router:
    """Routing decisions plus the bookkeeping that keeps the index and load view current."""

    def __init__(
        self,
        policy: Policy,
        index: PrefixIndex,
        load: LoadView,
        *,
        clock: Callable[[], float] = time.monotonic,
        predict_on_route: bool = True,
        sessions_kept: int = DEFAULT_SESSIONS_KEPT,
    ) -> None:
        self.policy = policy
        self.index = index
        self.load = load
        self._clock = clock
        self.predict_on_route = predict_on_route
        self._sessions_kept = sessions_kept
        self._sessions: OrderedDict[str, _SessionSeen] = OrderedDict()
        self._totals = _Totals()
        self._by_instance: Counter[str] = Counter()
        # called on every dispatch (the operator page's hot sessions and prefixes); pure
        # in-memory callbacks, they must not block
        self.dispatch_observers: list[Callable[[RouteRequest, Decision, str], None]] = []

    # -- deciding -----------------------------------------------------------------------

    def views(self, request: RouteRequest, candidates: Sequence[str]) -> list[InstanceView]:
        """Each candidate as a policy sees it (duplicates dropped, order kept)."""
        names = list(dict.fromkeys(candidates))
        matches = self.index.match(request.block_hashes, names, self._clock())
        views: list[InstanceView] = []
        load = self.load.view
        held = self.index.blocks_held
        for name in names:
            in_flight, queued = load(name)
            # positional: id, in_flight, queued_prefill_tokens, matched_blocks, blocks held
            views.append(InstanceView(name, in_flight, queued, matches[name], held(name)))
        return views

    def route(self, request: RouteRequest, candidates: Sequence[str]) -> Decision:
        """Choose an instance among `candidates` (healthy ones). The index and load view do
        not change (except the lazy reclamation of expired predictions); a policy that
        learns or rotates as it decides does."""
        return self._decide(self.policy.choose, request, candidates)

    def explain(self, request: RouteRequest, candidates: Sequence[str]) -> Decision:
        """The decision `route` would make, as a dry run: a policy that learns or rotates
        as it decides is asked for its `preview`, which changes nothing."""
        return self._decide(self.policy.preview, request, candidates)

    def _decide(
        self, decide: _Decide, request: RouteRequest, candidates: Sequence[str]
    ) -> Decision:
        if not candidates:
            raise NoCandidateError("no candidate instance for this request")
        return decide(request, self.views(request, candidates))

    # -- lifecycle ----------------------------------------------------------------------

    def on_dispatch(self, request: RouteRequest, decision: Decision, instance: str) -> None:
        """The request is being sent to `instance` (the decision's choice or a fallback)."""
        now = self._clock()
        computed = _uncached_tokens(request, decision, instance)
        self.load.on_dispatch(instance, computed)
        self.policy.on_dispatch(request, decision, instance, computed)
        if self.predict_on_route and request.block_hashes:
            self.index.insert(instance, request.block_hashes, Tier.HBM, now, predicted=True)
        self._totals.routed += 1
        self._by_instance[instance] += 1
        for observe in self.dispatch_observers:
            observe(request, decision, instance)
        if request.session_key:
            reason = decision.reason if instance == decision.instance else "failover"
            self._sessions[request.session_key] = _SessionSeen(
                instance, request.block_hashes, request.block_tokens, now, reason
            )
            self._sessions.move_to_end(request.session_key)
            while len(self._sessions) > self._sessions_kept:
                self._sessions.popitem(last=False)

    def on_first_token(
        self, request: RouteRequest, decision: Decision, instance: str, ttft_s: float
    ) -> None:
        """The first token came back: the request's prefill left the queue."""
        self.load.on_first_token(instance, _uncached_tokens(request, decision, instance))

    def on_complete(
        self,
        request: RouteRequest,
        decision: Decision,
        instance: str,
        *,
        ttft_s: float | None,
        reported_cached_tokens: int | None,
        ok: bool,
    ) -> None:
        """The request ended (`ttft_s` None: it failed before its first token)."""
        self.load.on_finish(
            instance,
            _uncached_tokens(request, decision, instance),
            got_first_token=ttft_s is not None,
        )
        by_tier = _predicted_by_tier(decision, instance)
        predicted = sum(by_tier.values())
        totals = self._totals
        totals.completed += 1
        if not ok:
            totals.failed += 1
        if ok:  # a failed attempt cached nothing: keep it out of the hit accounting
            totals.prompt_tokens += request.prompt_tokens
            totals.predicted_cached_tokens += predicted
        if reported_cached_tokens is not None:
            totals.reports += 1
            totals.reported_cached_tokens += reported_cached_tokens
            totals.predicted_cached_tokens_when_reported += predicted
        self.policy.observe(
            Outcome(
                instance=instance,
                prompt_tokens=request.prompt_tokens,
                predicted_cached_tokens=predicted,
                ttft_s=ttft_s,
                reported_cached_tokens=reported_cached_tokens,
                loaded_tokens_by_tier={
                    _TIER_BY_LABEL[label]: n
                    for label, n in by_tier.items()
                    if label in _TIER_BY_LABEL and label != Tier.HBM.label
                },
                decision=decision,
            )
        )

    # -- reporting ----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        t = self._totals
        policy_stats = self.policy.stats()  # what a learning policy knows
        return {
            "policy": self.policy.name,
            "routed": t.routed,
            "completed": t.completed,
            "failed": t.failed,
            "prompt_tokens": t.prompt_tokens,
            "predicted_cached_tokens": t.predicted_cached_tokens,
            "reported_cached_tokens": t.reported_cached_tokens,
            "predicted_cached_tokens_when_reported": t.predicted_cached_tokens_when_reported,
            "requests_with_report": t.reports,
            "routed_by_instance": dict(self._by_instance),
            "load": self.load.snapshot(),
            "index": dict(self.index.stats()),
            **({"policy_stats": policy_stats} if policy_stats is not None else {}),
        }

    def where(self, key: str | Sequence[int], block_tokens: int | None = None) -> dict[str, Any]:
        """Where a player's KV is believed to be: by session key (its last routed chain) or
        by a block chain. Tokens per instance, by tier label, for the leading run."""
        seen: _SessionSeen | None = None
        if isinstance(key, str):
            seen = self._sessions.get(key)
            if seen is None:
                return {"session_key": key, "known": False, "instances": {}}
            hashes: Sequence[int] = seen.hashes
            tokens_per_block = seen.block_tokens if block_tokens is None else block_tokens
        else:
            hashes = key
            tokens_per_block = 1 if block_tokens is None else block_tokens
        names = self.index.instances()
        matches = self.index.match(hashes, names, self._clock())
        instances = {
            name: {t.label: n * tokens_per_block for t, n in sorted(m.items())}
            for name, m in matches.items()
            if m
        }
        out: dict[str, Any] = {"blocks": len(hashes), "instances": instances}
        if seen is not None:
            out.update(
                session_key=key,
                known=True,
                last_instance=seen.instance,
                last_reason=seen.reason,
                seconds_since_last_route=max(0.0, self._clock() - seen.routed_at),
            )
        return out


def _predicted_by_tier(decision: Decision, instance: str) -> dict[str, int]:
    if instance == decision.instance:
        return dict(decision.cached_tokens_by_tier)
    for score in decision.candidates:
        if score.instance == instance:
            return dict(score.cached_tokens_by_tier)
    return {}


def _uncached_tokens(request: RouteRequest, decision: Decision, instance: str) -> int:
    """Prompt tokens `instance` has to compute for `request`, as the decision predicted: what
    the request adds to that instance's prefill queue (the same figure on entry and exit)."""
    cached = sum(_predicted_by_tier(decision, instance).values())
    return max(1, request.prompt_tokens - cached)
