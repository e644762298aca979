"""The `ttft` policy's guard (issue 24: do no harm while uncertain, no unbounded deferral).

Algorithm:
1. `prefix` (the SGLang cache-aware baseline, router/policies/prefix.py, at its defaults)
   picks P for the request; the policy scores every candidate (router/policies/ttft.py)
   and makes its own choice C.
2. Each instance carries the policy's own prediction error: an EWMA (weight `error_alpha`)
   of |log(observed TTFT / predicted TTFT)| over the outcomes the policy pairs with their
   predictions, and their count.
3. (`rule="robust"`, the default: the error sets the margin.) C stands when C is P, or
   when C passes two tests, each instance's error err(i) read as its band:
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
   An instance with fewer than `trust_min_observations` (n) outcomes has not earned a band
   of its own. With `unearned_band="none"` (the default) it cannot be chosen against P, and
   while P itself has not earned one the request goes to P. With `"prior"` its band is
   shrunk towards a prior, `(k x e_i + (n - k) x prior) / n` after k outcomes of mean error
   e_i, the prior being the largest error among instances with n outcomes, else
   `prior_error` (1.0: off by a factor e either way), so at the start a deviation needs a
   predicted gain of about e^2 (7x); `"fixed"` shrinks towards `prior_error` alone, never
   borrowing another instance's (smaller) error. Why they exist: an instance P never picks
   never earns its outcomes. On two real vLLM engines with tierd (seed 103) P, whose balance
   thresholds are for large fleets, kept 106 of 129 requests on one engine in every repeat
   while the other stood idle, and `ttft` followed (TTFT p50 1.04 s; 0.31 s with `"prior"`,
   3 rotated repeats). Neither is the default: over the cluster cases of docs/BENCHMARKS.md
   they put more game seeds' p50 over prefix's than control perturbations do ("Starved
   instances", 2026-12-05), and `"fixed"` has not yet run on real engines.
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
UnearnedBand = Literal["none", "prior", "fixed"]  # the band of an instance short of its outcomes


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
        unearned_band: UnearnedBand = "none",
        prior_error: float = 1.0,
    ) -> None:
        if unearned_band not in ("none", "prior", "fixed"):
            raise PolicyConfigError(
                f"unknown unearned_band {unearned_band!r}: none, prior or fixed"
            )
        if (
            trust_error <= 0
            or prior_error < 0
            or trust_min_observations < 0
            or max_added_wait_s < 0
            or robust_added_wait_s < 0
        ):
            raise PolicyConfigError(
                "trust_error must be > 0, prior_error, trust thresholds and caps >= 0"
            )
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
        self.unearned_band = unearned_band
        self.prior_error = prior_error
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

    def band(self, instance: str) -> float | None:
        """err(instance) as step 3 reads it: its own error once it has
        `trust_min_observations` outcomes. Before: None (not choosable against P) with
        `unearned_band="none"`; with `"prior"`, shrunk towards the largest error an instance
        has earned, else `prior_error`; with `"fixed"`, towards `prior_error` alone."""
        n = self.trust_min_observations
        k = self.observed.get(instance, 0)
        if k >= n:
            return self.error.get(instance, 0.0)
        if self.unearned_band == "none":
            return None
        earned = [self.error[i] for i, count in self.observed.items() if count >= n]
        prior = max(earned) if earned and self.unearned_band != "fixed" else self.prior_error
        return (k * self.error.get(instance, 0.0) + (n - k) * prior) / n

    def _robust(self, base: Scored, allowed: list[Scored], chosen: Scored) -> Scored | None:
        e_base = self.band(base.view.id)
        if e_base is None:
            return base
        best_case_base = base.score - base.pred.ttft_s * (1.0 - math.exp(-e_base))

        def eligible(s: Scored) -> bool:
            if s.pred.ttft_s > base.pred.ttft_s + self.robust_added_wait_s:
                return False
            e = self.band(s.view.id)
            if e is None:
                return False
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
            "error_band": {i: self.band(i) for i in sorted(self.observed)},
        }
