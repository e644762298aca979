"""The `ttft` policy's guard (issue 24: do no harm while uncertain, no unbounded deferral).

Algorithm:
1. `prefix` (the SGLang cache-aware baseline, router/policies/prefix.py, at its defaults)
   picks P for the request; the policy scores every candidate (router/policies/ttft.py)
   and makes its own choice C.
2. Each instance carries the policy's own prediction error: an EWMA (weight `error_alpha`)
   of |log(observed TTFT / predicted TTFT)| over the outcomes the policy pairs with their
   predictions, and their count.
3. (`rule="robust"`, the default: the error sets the margin.) C stands when C is P, or
   when both have `trust_min_observations` outcomes and C passes two tests:
   - robustly better: `score(C) + ttft(C) x (e^err(C) - 1) < score(P) - ttft(P) x
     (1 - e^-err(P))` (C's predicted TTFT as late as its error band allows, P's as early);
   - no worse for the request itself: C's own predicted TTFT is at most P's plus
     `robust_added_wait_s` (0 by default).
   The first test also passes (`own_gain`, the default) when the request's own gain is
   robust and the scoring prefers C: `ttft(C) x e^err(C) < ttft(P) x e^-err(P)` and
   `score(C) < score(P)`. The error band is a band on TTFT; the score's other terms are
   prices, and a price that nearly cancels a robust gain of seconds (the reuse price in a
   burst) must not send the request to the queue the band says is slower.
   Otherwise the choice is the best-scored candidate that passes both, else P.
So before enough outcomes the request goes where `prefix` would send it; with exact
predictions (error 0) the scoring decides alone, and the larger the error, the larger the
predicted gain a deviation needs. Since a deviation never makes the request wait longer
than prefix's choice is predicted to, no request is deferred without bound under overload.
The scoring may still weigh what a choice costs the requests after it, but only among
candidates no worse for this one: trading a request's own wait for the fleet's rests on
predicted queues elsewhere, what the cost model knows least, and it was what hurt. On the
8B/H100 profile the robust rule with a 1 s allowance sent 213 of its 407 deviations to
instances predicted slower for the request itself (60 s of added predicted wait in all) and
its p99 was 1.91x prefix's; at 0 it is 0.86x, and over the 35 cluster cases of
docs/BENCHMARKS.md it beats the trust rule at p50, p90 and p99 in 26-28 of them.

Step 3 with `rule="trust"` (the rule before): the trust of an instance is
`max(0, 1 - error / trust_error)`, and 0 until it has `trust_min_observations`. C stands
when both C and P are trusted (trust > 0) and C's predicted TTFT is at most P's plus
`max_added_wait_s x min(trust C, trust P)` (the deferral cap); otherwise the choice is the
best-scored of P and the candidates within that cap of P (P alone while P is untrusted).
(`rule="trust"` with `max_added_wait_s=inf`, `trust_min_observations=0` and
`trust_error=inf` turns the guard off.)

The guard keeps no prediction of its own: it reads the scored candidates the policy hands
it, and learns only from (observed, predicted) pairs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from router.errors import PolicyConfigError
from router.policies.base import InstanceView
from router.policies.prefix import PrefixPolicy
from router.policies.ttft_records import Scored
from router.types import RouteRequest

GuardRule = Literal["trust", "robust"]


class TrustGuard:
    """Per-instance prediction error, the trust it earns, and the override of step 3."""

    def __init__(
        self,
        *,
        trust_error: float = 0.3,
        trust_min_observations: int = 20,
        error_alpha: float = 0.1,
        max_added_wait_s: float = 1.0,
        robust_added_wait_s: float = 0.0,
        rule: GuardRule = "robust",
        own_gain: bool = True,
    ) -> None:
        if (
            trust_error <= 0
            or trust_min_observations < 0
            or max_added_wait_s < 0
            or robust_added_wait_s < 0
        ):
            raise PolicyConfigError("trust_error must be > 0, trust thresholds and caps >= 0")
        if not 0 < error_alpha <= 1:
            raise PolicyConfigError("error_alpha must be in (0, 1]")
        if rule not in ("trust", "robust"):
            raise PolicyConfigError(f"unknown guard rule {rule!r}: trust or robust")
        self.trust_error = trust_error
        self.trust_min_observations = trust_min_observations
        self.error_alpha = error_alpha
        self.max_added_wait_s = max_added_wait_s
        self.robust_added_wait_s = robust_added_wait_s
        self.rule = rule
        self.own_gain = own_gain
        self.baseline = PrefixPolicy()
        self.error: dict[str, float] = {}  # EWMA of |log(observed / predicted TTFT)|
        self.observed: dict[str, int] = {}  # outcomes paired with a prediction
        self.guarded_decisions = 0  # decisions where the guard overrode the policy's choice

    def trust(self, instance: str) -> float:
        """How far predictions for `instance` are trusted: 0 (follow `prefix`) until it has
        `trust_min_observations`, then `1 - error / trust_error`, at least 0."""
        if self.observed.get(instance, 0) < self.trust_min_observations:
            return 0.0
        return max(0.0, 1.0 - self.error.get(instance, 0.0) / self.trust_error)

    def record(self, instance: str, observed_s: float, predicted_s: float) -> None:
        """One outcome on `instance` paired with its prediction (both positive)."""
        if not (observed_s > 0.0 and predicted_s > 0.0):
            return
        error = abs(math.log(observed_s / predicted_s))
        previous = self.error.get(instance)
        a = self.error_alpha
        self.error[instance] = error if previous is None else (1.0 - a) * previous + a * error
        self.observed[instance] = self.observed.get(instance, 0) + 1

    def override(
        self,
        request: RouteRequest,
        candidates: Sequence[InstanceView],
        scored: list[Scored],
        allowed: list[Scored],
        chosen: Scored,
    ) -> Scored | None:
        """Step 3: the candidate to use instead of `chosen` (prefix's choice P, or the
        best-scored candidate within the deferral cap of P), or None when `chosen` stands."""
        target = self.baseline.target(request, candidates)
        if chosen.view.id == target:
            return None
        base = next(s for s in scored if s.view.id == target)
        if self.rule == "robust":
            return self._robust(base, allowed, chosen)
        trust_base = self.trust(target)
        if trust_base > 0.0:
            trust_chosen = self.trust(chosen.view.id)
            limit_s = base.pred.ttft_s + self.max_added_wait_s * min(trust_base, trust_chosen)
            if trust_chosen > 0.0 and chosen.pred.ttft_s <= limit_s:
                return None
            eligible = [
                s
                for s in allowed
                if (t := min(trust_base, self.trust(s.view.id))) > 0.0
                and s.pred.ttft_s <= base.pred.ttft_s + self.max_added_wait_s * t
            ]
            best = min(eligible, key=lambda s: s.score, default=base)
            if best.score < base.score:
                base = best
        return base

    def _robust(self, base: Scored, allowed: list[Scored], chosen: Scored) -> Scored | None:
        n = self.trust_min_observations
        if self.observed.get(base.view.id, 0) < n:
            return base
        e_base = self.error.get(base.view.id, 0.0)
        best_case_base = base.score - base.pred.ttft_s * (1.0 - math.exp(-e_base))

        def eligible(s: Scored) -> bool:
            if self.observed.get(s.view.id, 0) < n:
                return False
            if s.pred.ttft_s > base.pred.ttft_s + self.robust_added_wait_s:
                return False
            e = self.error.get(s.view.id, 0.0)
            if s.score + s.pred.ttft_s * (math.exp(e) - 1.0) < best_case_base:
                return True
            return (
                self.own_gain
                and s.score < base.score
                and s.pred.ttft_s * math.exp(e) < base.pred.ttft_s * math.exp(-e_base)
            )

        if eligible(chosen):
            return None
        return min((s for s in allowed if eligible(s)), key=lambda s: s.score, default=base)

    def stats(self) -> dict[str, object]:
        return {
            "guarded_decisions": self.guarded_decisions,
            "prediction_error": dict(self.error),
            "trust": {i: self.trust(i) for i in sorted(self.observed)},
        }
