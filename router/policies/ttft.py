"""ttft: warmgate's default policy. Send each request where its time to first token is
predicted to be lowest, counting what that choice costs the requests after it, but never
on predictions it has not earned the right to trust.

The rule (issue 24, item 2): it chooses as `prefix` would (the SGLang cache-aware
baseline) unless its own choice wins by more than its own prediction error could undo, one
instance at a time, and never makes a request wait longer than prefix's choice is
predicted to. The guard that applies the
rule (error tracking, trust, the deferral cap) is router/policies/ttft_guard.py, whose
docstring states it step by step. What makes the error fall fast is calibration: every
paired outcome (`observe`), and before any routed request the instance's join probe
(`calibrate`, the gateway's gateway/fleet/calibration_probe.py): a few cold prompts of known
sizes whose measured TTFTs price the engine at its real speed, so the generic prior stops
mattering at once.

The scoring:

For every candidate the cost model (`router.cost`) predicts
`ttft = queue_wait + load + prefill`: the queued prefill work ahead of it, the part of the
tier loads (bytes of matched host / array / snapshot blocks / that tier's bandwidth) a prefetch
cannot hide behind the queue, and the prefill of the uncached part, all scaled by the
instance's speed as calibrated from observed TTFTs. With `max_num_seqs` given (the engines'
flag), an instance with that many or more in flight adds the wait for a running slot
(`router.slot_waits`: `(in_flight - max_num_seqs + 1) / completions per second` over
`rate_window_s`). Only while some instance has a free slot: when all are full the wait is
everywhere, and pricing it there too moved work off its cache (Mooncake at twice its rate
went to p99 1.8x prefix's). Each candidate is scored

    score = ttft + imposed_delay + streams x work
                 + reuse_price x recompute_time(tokens given up)
                 + recompute_time(active KV pushed out)

where recompute_time is the candidate's own, as calibrated (`TtftCostModel.
recompute_s_per_token`: its probe's prefill curve times its speed factor), so a price is in
the same seconds as the TTFT it is weighed against, whatever the prior's engine was.

- `imposed_delay` is the first-order delay the request's GPU work w adds to later arrivals
  on that instance (prefill is first come, first served): rate x (queue_wait x w + w^2/2).
  The rate is the fleet's arrival rate (measured over `rate_window_s`) shared among
  instances in proportion to the requests each serves, since follow-up turns return where
  their KV is. A long recompute next to many live sessions costs more than its own TTFT.
- `streams x work` is the stall the request's GPU work imposes on the streams it shares
  the instance's steps with: every engine step that carries a prefill chunk also carries
  one token of each decoding sequence, so each of them waits `work` seconds longer for the
  rest of its answer. The streams there when its prefill runs are the requests in flight
  there now: those prefilling ahead of it (first come, first served) will be decoding by
  then. A stream stalled for a second weighs as much as a second of TTFT (`stall_weight`
  = 1): players feel both. Without this term a burst of new sessions is spread over every
  instance and slows every stream in the fleet; with it cold work gathers where fewer
  streams would stall, which also keeps the decode batches small, and with them the steps
  that cached follow-up turns wait for. It is charged to cold prompts only (no candidate
  holds half of the prompt) and only while the fleet is not saturated (below):
  - a mostly cached prompt's KV decides where it goes, and pricing the streams there only
    moves sessions off their KV (measured with the shared array, where a move costs little
    TTFT: the game p50 rose by 35 ms);
  - saturated, the prefill runs after a queue longer than itself wherever it goes, and who
    streams by then is not who is in flight now (charged there too, Mooncake at twice its
    rate lost 8% of p99 to `prefix`, and at its own rate TPOT p99 was 9% higher).
- `reuse_price` (dual ascent, `router.cost.ReuseBudget`) keeps the share of cacheable
  prompt tokens given up by choice near `reuse_budget`: TTFT is minimised subject to
  giving up at most that much reuse. While the fleet is saturated (even the emptiest
  instance has more work queued than recomputing the whole prompt would take) the budget
  is hard: only candidates whose given-up tokens fit the budget's allowance qualify, as
  extra work then only lengthens every queue; unless (`saturated_budget="unless_faster"`,
  the default) another candidate's predicted TTFT, with the recompute of the cache it
  gives up charged again for each arrival expected behind it while it waits there (the
  instance's arrival rate x its queue wait, at least one), still beats the fastest
  permitted one. Charged once (the rule before), Mooncake at twice its rate went to p99
  1.13x prefix's once the price was in calibrated seconds; with each arrival, 0.97x. A
  burst (a world event: a hundred lines of one zone in three seconds) saturates the
  fleet while its queues are far apart: hard, the budget kept every line on the zone's
  two instances at 5-7 s while two others predicted 1.5-2 s for 1,792 of 10k tokens
  given up (game seed 15, the p99's 36 requests all in that burst).
- `active KV pushed out` prices HBM capacity. A session's turns follow its KV, so the
  instance a session is placed on holds its KV for its whole dialogue. Each instance's
  working set is the KV its active sessions computed there (`router.footprints`); when
  the tokens this request computes would take it past the instance's KV capacity, LRU
  will evict that much of some active session's KV, which is recomputed when that
  session returns: `max(0, W + U - C) - max(0, W - C)` tokens for working set W, computed
  tokens U and capacity C. Without a known capacity (`kv_capacity_tokens`,
  `set_kv_capacity`) the term is zero.

Then:
1. Load cap: an instance holding `load_cap` x the fair share of the requests in flight
   (`ceil((in_flight_total + 1) / n)`, at least `load_cap_min`) is only chosen when every
   instance is at the cap; this guards against herding on a hot prefix (a world-state
   prefix everyone matches), which then gets replicated on another instance.
2. Near-ties (within `tie_rel` of the best score, or `tie_abs_s`) go by session affinity:
   the instance holding more of the prompt (where the session's KV is), then the one the
   session key ranks highest by rendezvous hashing (stable while the fleet is, so a new
   session's turns agree), then the less loaded.

`choose()` changes no state: it decides on copies and hands its `Decision` a pending
record (each candidate's prediction, the arrival, the reuse given up). `on_dispatch()`,
called by the router for the instance a request was actually sent to (the choice, a session
binding's redirect, a fallback), commits it for that instance and keeps the footprints;
`observe()` pairs an outcome with the prediction for the instance it ran on, through the
outcome's decision. `preview()` is the same decision with nothing to commit (explain).
`set_bandwidths()` takes measured tier bandwidths (tierd stats).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from router.cost import ArrivalRate, CostParams, ReuseBudget, TtftCostModel
from router.errors import PolicyConfigError
from router.footprints import SessionFootprints
from router.policies.base import CalibrationSample, InstanceView, Outcome, Policy
from router.policies.scoring import cached_tokens_by_tier
from router.policies.ttft_guard import GuardRule, TrustGuard, UnearnedBand
from router.policies.ttft_records import Pending, Scored, explain, tie_key
from router.slot_waits import SlotWaits
from router.types import (
    Decision,
    LazyCandidates,
    RouteRequest,
    ordered_fallbacks,
)

SaturatedBudget = Literal["hard", "unless_faster"]  # the reuse budget while saturated


def cost_params(given: CostParams | Mapping[str, Any] | None) -> CostParams:
    """The cost model's profile from code (a CostParams) or a config file (a mapping of its
    fields, e.g. `routing.params.params.prefill_per_token_s` in YAML)."""
    if given is None:
        return CostParams()
    if isinstance(given, CostParams):
        return given
    if not isinstance(given, Mapping):
        raise PolicyConfigError(
            f"ttft params must be a mapping of CostParams fields, not {given!r}"
        )
    known = {f.name for f in dataclasses.fields(CostParams)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise PolicyConfigError(f"unknown ttft cost params {unknown}; known: {sorted(known)}")
    return CostParams(**dict(given))


class TtftPolicy(Policy):
    name = "ttft"
    wants_kv_capacity = True  # the cost model caps how much KV an instance may be given

    def __init__(
        self,
        *,
        params: CostParams | Mapping[str, Any] | None = None,
        bandwidths: Mapping[str, float] | None = None,
        tie_rel: float = 0.05,
        tie_abs_s: float = 0.01,
        load_cap: float = 3.0,
        load_cap_min: int = 4,
        forgetting: float = 0.98,
        prior_weight: float = 2.0,
        prior_decay: float = 0.7,
        rate_window_s: float = 30.0,
        reuse_budget: float = 0.005,
        reuse_step: float = 0.05,
        reuse_price_max: float = 10.0,
        reuse_burst_prompts: float = 2.0,
        kv_capacity_tokens: int | None = None,
        max_num_seqs: int | None = None,
        session_window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        stall_weight: float = 1.0,
        trust_error: float = 0.3,
        trust_min_observations: int = 20,
        error_alpha: float = 0.1,
        max_added_wait_s: float = 1.0,
        robust_added_wait_s: float = 0.0,
        guard_rule: GuardRule = "robust",
        saturated_budget: SaturatedBudget = "unless_faster",
        robust_own_gain: bool = True,
        unearned_band: UnearnedBand = "none",
        prior_error: float = 1.0,
    ) -> None:
        if saturated_budget not in ("hard", "unless_faster"):
            raise PolicyConfigError(
                f"unknown saturated_budget {saturated_budget!r}: hard or unless_faster"
            )
        self.saturated_budget = saturated_budget
        if tie_rel < 0 or tie_abs_s < 0:
            raise PolicyConfigError("tie tolerances must be >= 0")
        if stall_weight < 0:
            raise PolicyConfigError("stall_weight must be >= 0")
        if load_cap < 1.0:
            raise PolicyConfigError("load_cap must be >= 1")
        if kv_capacity_tokens is not None and kv_capacity_tokens <= 0:
            raise PolicyConfigError("kv_capacity_tokens must be positive")
        base = cost_params(params)
        if bandwidths is not None:
            base = dataclasses.replace(base, bandwidths={**base.bandwidths, **bandwidths})
        self.model = TtftCostModel(
            base, forgetting=forgetting, prior_weight=prior_weight, prior_decay=prior_decay
        )
        self.tie_rel = tie_rel
        self.stall_weight = stall_weight
        self.tie_abs_s = tie_abs_s
        self.load_cap = load_cap
        self.load_cap_min = load_cap_min
        self.reuse = ReuseBudget(
            reuse_budget, reuse_step, price_max=reuse_price_max, burst_prompts=reuse_burst_prompts
        )
        self._arrivals = ArrivalRate(rate_window_s)
        # the engines' running-sequence slots (None: unbounded, no wait priced)
        self.slots = SlotWaits(max_num_seqs, rate_window_s) if max_num_seqs is not None else None
        self._clock = clock
        self.saturated_decisions = 0
        # KV capacity per instance, in tokens: the default for all, or what each reported
        self.kv_capacity_tokens = kv_capacity_tokens
        self._kv_capacity: dict[str, int] = {}
        self.footprints = SessionFootprints(default_window_s=session_window_s)
        self.guard = TrustGuard(
            trust_error=trust_error,
            trust_min_observations=trust_min_observations,
            error_alpha=error_alpha,
            max_added_wait_s=max_added_wait_s,
            robust_added_wait_s=robust_added_wait_s,
            rule=guard_rule,
            own_gain=robust_own_gain,
            unearned_band=unearned_band,
            prior_error=prior_error,
        )

    def trust(self, instance: str) -> float:
        """How far the policy trusts its predictions for `instance` (router/policies/
        ttft_guard.py): 0 means it follows `prefix` there."""
        return self.guard.trust(instance)

    def calibrate(self, instance: str, samples: Sequence[CalibrationSample]) -> None:
        """The join probe's cold, idle TTFTs price `instance` before any routed request
        (`TtftCostModel.calibrate`); the guard's trust is still earned by routed outcomes."""
        self.model.calibrate(instance, [(s.prompt_tokens, s.ttft_s) for s in samples])

    def set_bandwidths(self, instance: str, bandwidths: Mapping[str, float]) -> None:
        """Measured bytes/s per tier label ("host", "array", "snapshot") into `instance`'s HBM."""
        self.model.set_bandwidths(instance, bandwidths)

    def set_kv_capacity(self, instance: str, tokens: int) -> None:
        """`instance`'s HBM KV capacity in tokens (its engine's blocks x block size)."""
        if tokens > 0:
            self._kv_capacity[instance] = tokens

    def on_dispatch(
        self, request: RouteRequest, decision: Decision, instance: str, computed_tokens: int
    ) -> None:
        """The request was sent to `instance`, computing `computed_tokens` there: the
        decision's arrival and reuse (for the cache given up on the instance actually used)
        are committed, once per decision; a failover's later dispatch only records where
        the session's KV now grows."""
        if request.session_key:
            self.footprints.record(request.session_key, instance, computed_tokens, self._clock())
        pending = decision.pending
        if not isinstance(pending, Pending) or pending.committed:
            return
        pending.committed = True
        self._arrivals.tick(pending.now)
        self.reuse.refill(request.prompt_tokens)
        self.reuse.update(pending.most - pending.cached.get(instance, 0), request.prompt_tokens)
        if pending.saturated:
            self.saturated_decisions += 1

    def _cap(self, total_in_flight: int, candidates: int) -> int:
        fair = -(-(total_in_flight + 1) // candidates)  # ceil
        return max(self.load_cap_min, math.ceil(self.load_cap * fair))

    def _score_all(
        self,
        request: RouteRequest,
        candidates: Sequence[InstanceView],
        cap: int,
        arrivals: ArrivalRate,
        reuse: ReuseBudget,
    ) -> tuple[list[Scored], list[Scored], bool, float]:
        """Every candidate scored; those under the load cap (all, when none is); and whether
        the fleet is saturated: even the emptiest of those has more work queued than this
        whole prompt's prefill (a move then finds no spare capacity)."""
        # the hot loop of the default policy: attribute lookups hoisted, builtins avoided
        predict = self.model.predict
        prompt = request.prompt_tokens
        now = self._clock()
        slots = self.slots
        if slots is not None and not slots.any_free(candidates):
            slots = None  # every slot taken everywhere: the wait is not priced (see the top)
        scored: list[Scored] = []
        most = 0  # the most any instance under the load cap has cached
        cached_anywhere = 0  # the most any instance has cached
        in_flight_total = 0
        for v in candidates:
            tiers = cached_tokens_by_tier(request, v.matched_blocks) if v.matched_blocks else {}
            pred = predict(
                v.id,
                prompt_tokens=prompt,
                cached_tokens_by_tier=tiers,
                in_flight=v.in_flight,
                queued_prefill_tokens=v.queued_prefill_tokens,
            )
            if slots is not None and (wait := slots.wait_s(v.id, v.in_flight, now)) > 0.0:
                pred = pred._replace(ttft_s=pred.ttft_s + wait, slot_wait_s=wait)
            cached = sum(tiers.values()) if tiers else 0
            if cached > cached_anywhere:
                cached_anywhere = cached
            if cached > most and v.in_flight < cap:
                most = cached
            in_flight_total += v.in_flight
            scored.append(Scored(v, tiers, pred, cached))
        arrivals.tick(now)
        # later arrivals per second at each instance: the fleet's rate, shared in proportion
        # to the requests each serves (their follow-ups come back to it)
        per_request = arrivals.rate(now) / (in_flight_total + len(candidates))
        allowed = [s for s in scored if s.view.in_flight < cap] or scored
        saturated = min(s.pred.queue_wait_s for s in allowed) > max(
            s.pred.prefill_s for s in allowed
        )
        # the stall decides where work without a home goes. A prompt that is mostly cached
        # somewhere has one (its KV), and moving it for fewer streams only trades its TTFT.
        # Saturated, its prefill runs after a queue longer than itself everywhere, and who
        # streams then is not who is in flight now
        stall_weight = 0.0 if saturated or 2 * cached_anywhere >= prompt else self.stall_weight
        self.footprints.expire(now)
        recompute_s = self.model.recompute_s_per_token
        for s in scored:
            per_token_s = s.recompute_s = recompute_s(s.view.id)  # where it would recompute
            s.arrivals_per_s = per_request * (s.view.in_flight + 1)
            s.imposed_s = s.pred.imposed_delay_s(s.arrivals_per_s)
            s.reuse_s = reuse.price * per_token_s * (most - s.cached) if most > s.cached else 0.0
            s.pushed_out_s = per_token_s * self._pushed_out(s.view.id, prompt - s.cached)
            s.stall_s = stall_weight * s.view.in_flight * s.pred.work_s
            s.score = s.pred.ttft_s + s.imposed_s + s.stall_s + s.reuse_s + s.pushed_out_s
        return scored, allowed, saturated, now

    def _within_budget(self, allowed: list[Scored], reuse: ReuseBudget, most: int) -> list[Scored]:
        """Saturated, the candidates the reuse budget's allowance permits, and (with
        `saturated_budget="unless_faster"`) any other whose predicted TTFT, with the
        recompute of the cache it gives up charged again for each arrival expected behind
        it while it waits (at least one), still beats the fastest permitted one: a burst's
        long queue is left for a short one only where the move wins more than the work it
        adds."""
        permitted = [s for s in allowed if reuse.permits(most - s.cached)]
        if self.saturated_budget == "hard":  # never empty: the most cached loses nothing
            return permitted
        fastest = min(s.pred.ttft_s for s in permitted)

        def added_s(s: Scored) -> float:
            # the recompute, paid again by each arrival expected behind it while it waits
            # (at least one: the rule before counted exactly one)
            behind = max(1.0, s.arrivals_per_s * s.pred.queue_wait_s)
            return s.recompute_s * (most - s.cached) * behind

        return [s for s in allowed if s in permitted or s.pred.ttft_s + added_s(s) < fastest]

    def _pushed_out(self, instance: str, computed_tokens: int) -> int:
        """Tokens of active sessions' KV that computing `computed_tokens` more on `instance`
        would push out of its HBM (0 while the working set fits, or capacity unknown)."""
        capacity = self._kv_capacity.get(instance, self.kv_capacity_tokens)
        if not capacity:
            return 0
        working = self.footprints.working_set(instance)
        return max(0, working + max(0, computed_tokens) - capacity) - max(0, working - capacity)

    def choose(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> Decision:
        """The decision, changing nothing yet: it decides on copies of the rate meter and
        reuse budget (this arrival counted), and its `pending` record is what `on_dispatch`
        commits for the instance actually used. (Sessions idle past their window are
        retired, as any later call would retire them.)"""
        arrivals, reuse = copy.copy(self._arrivals), copy.copy(self.reuse)
        return self._decide(request, candidates, arrivals, reuse, commit=True)

    def preview(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> Decision:
        """The decision `choose` would make now, with nothing to commit (explain)."""
        arrivals, reuse = copy.copy(self._arrivals), copy.copy(self.reuse)
        return self._decide(request, candidates, arrivals, reuse, commit=False)

    def _decide(
        self,
        request: RouteRequest,
        candidates: Sequence[InstanceView],
        arrivals: ArrivalRate,
        reuse: ReuseBudget,
        *,
        commit: bool,
    ) -> Decision:
        cap = self._cap(sum(v.in_flight for v in candidates), len(candidates))
        scored, allowed, saturated, now = self._score_all(request, candidates, cap, arrivals, reuse)
        capped = len(scored) - len(allowed)
        reuse.refill(request.prompt_tokens)
        most = max(s.cached for s in allowed)
        if saturated:  # the reuse budget is hard, unless a move is faster (the top)
            allowed = self._within_budget(allowed, reuse, most)
        best = min(s.score for s in allowed)
        ties = [s for s in allowed if s.score <= best + max(self.tie_abs_s, self.tie_rel * best)]
        chosen = ties[0] if len(ties) == 1 else min(ties, key=tie_key(request.session_key))
        guard = self.guard.override(request, candidates, scored, allowed, chosen)
        if guard is not None:
            chosen = guard
            self.guard.guarded_decisions += commit
        ranked = sorted(scored, key=lambda s: (s.view.in_flight >= cap, s.score))
        reason = f"lowest predicted TTFT {chosen.pred.ttft_s:.3f}s (score {chosen.score:.3f})"
        if len(ties) > 1:
            reason += f", tie of {len(ties)} broken by affinity"
        if capped:
            reason += f", {capped} at load cap {cap}"
        if saturated:
            reason += ", fleet saturated: reuse budget enforced"
        if guard is not None:
            reason += ", guarded: prefix's choice or within the deferral cap of it"
        return Decision(
            instance=chosen.view.id,
            policy=self.name,
            reason=reason,
            cached_tokens=chosen.cached,
            cached_tokens_by_tier=chosen.tiers,
            predicted_ttft_s=chosen.pred.ttft_s,
            fallbacks=ordered_fallbacks(chosen.view.id, [s.view.id for s in ranked]),
            candidates=LazyCandidates(lambda: tuple(explain(s) for s in scored)),
            pending=Pending(
                now=now,
                most=most,
                saturated=saturated,
                cached={s.view.id: s.cached for s in scored},
                predictions={s.view.id: s.pred for s in scored},
            )
            if commit
            else None,
        )

    def observe(self, outcome: Outcome) -> None:
        """Calibrate on the outcome, against the prediction made for the instance it ran on
        (its decision's record: no lookup by sizes that equal requests share)."""
        pending = outcome.decision.pending if outcome.decision is not None else None
        pred = pending.predictions.get(outcome.instance) if isinstance(pending, Pending) else None
        cached = (
            outcome.reported_cached_tokens
            if outcome.reported_cached_tokens is not None
            else outcome.predicted_cached_tokens
        )
        if pred is not None and outcome.ttft_s is not None:
            self.guard.record(outcome.instance, outcome.ttft_s, pred.ttft_s)
        if self.slots is not None:
            self.slots.record_finish(outcome.instance, self._clock())
        self.model.observe(
            outcome.instance,
            prompt_tokens=outcome.prompt_tokens,
            cached_tokens=cached,
            ttft_s=outcome.ttft_s,
            prediction=pred,
        )

    def stats(self) -> dict[str, object]:
        instances = self.model.snapshot()  # those with outcomes observed
        known = sorted({*instances, *self._kv_capacity, *self.footprints.instances()})
        return {
            "instances": instances,
            "reuse_price": self.reuse.price,
            "reuse_lost_share": self.reuse.lost_share,
            "saturated_decisions": self.saturated_decisions,
            **self.guard.stats(),
            "kv_capacity_tokens": {
                i: self._kv_capacity.get(i, self.kv_capacity_tokens) for i in known
            },
            "active_sessions": len(self.footprints),
            "session_window_s": self.footprints.window_s,
            "working_set_tokens": {i: self.footprints.working_set(i) for i in known},
        }
