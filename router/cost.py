"""The TTFT cost model of the `ttft` policy: what a request's time to first token would be on
one instance, in seconds, and its calibration from observed TTFTs.

For a request of U uncached tokens after C cached ones on an instance with Q queued prefill
tokens (to compute, i.e. less what was predicted cached) and D requests in flight:

    compute  = queue + prefill + interference            (GPU time, seconds)
      queue        = Q x t_tok                      t_tok: seconds per uncached token at
                                                      the instance's mean context
      prefill      = overhead + per_token U + attention U (C + U/2)
      interference = ceil((Q + U) / budget) x decode_step(D, D x context)
                     (chunked prefill shares each step with every decoding sequence)
    load     = sum over slow tiers of tokens x kv_bytes_per_token / bandwidth(tier)
    ttft     = k x compute + max(0, load - k x queue)

The prefetch hint starts tier loads when the request is routed, so the load overlaps the
queue wait and only what is left after it adds to the TTFT. `k` is the instance's speed
against the prior, calibrated online without bounds, so an engine 100x slower or faster
than the prior is tracked: least squares through the origin with exponential forgetting
over the outcomes (x = predicted compute, y = observed TTFT minus the predicted visible
load), blended in log space with a prior k_0 (the fastest other instance's fit, else 1)
worth `prior_weight` outcomes, a weight that decays by `prior_decay` with every outcome:

    k = exp((w_p log k_0 + n log k_fit) / (w_p + n)),  k_fit = sum(l^i x y) / sum(l^i x^2)

so the prior steers the first few predictions only (100x off: within 5% after a dozen, see
test_cost). An unobserved instance borrows the fastest fit (optimism: else never tried).
Where the prior matters, then: for an instance nobody has measured, and for its first few
outcomes; and its shape (the split between fixed, per-token and attention cost, and the
decode step) for as long as nothing measures it. A join probe (`calibrate`: cold prompts of
known sizes on the idle instance, measured before any routed request lands there) ends both
for prefill at once. With three sizes or more it fits the instance's own prefill curve,
`overhead + per_token U + attention U^2 / 2` (least squares; with two sizes the attention
term keeps the prior's ratio to the per-token cost, and a fit with a negative coefficient
falls back to fewer terms), which replaces the prior's prefill coefficients for that
instance; with one sample, or none of the fits valid, only the scale k is fitted. Either
way the samples enter the fit of k against the instance's curve and the prior's weight
there drops to zero, so the first routed request is priced at the probe's speed. The
decode-step terms stay the prior's (the probe asks for one token), scaled by k.

The prior (`CostParams()`) is generic, not any one deployment's: llm-d-inference-sim's
published profile for an 8B model on one H100 (prefill 30 ms + 250 us per uncached token,
12 ms per decode step; PROTOCOLS.md section 5), with an attention term of Dynamo's mocker
(its quadratic prefill coefficient, 4.2e-10 s/token^2, is prefill_attention_s / 2 here) and
KV of 128 KiB per token (Llama-3-8B, bf16). Calibration scales it to the engine at hand.

Also here, the other inputs of the policy's score: `ArrivalRate` (arrivals per second,
exponentially decayed) and `ReuseBudget` (the price and allowance that bound how much
cached prompt the policy gives up by choice).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from contracts.tiers import DEFAULT_BANDWIDTH_BPS, Tier
from router.errors import PolicyConfigError


@dataclass(frozen=True, slots=True)
class CostParams:
    """The profile the model starts from (defaults: the generic prior described above)."""

    prefill_overhead_s: float = 0.030  # llm-d-inference-sim, 8B on one H100
    prefill_per_token_s: float = 250e-6  # ditto
    prefill_attention_s: float = 8.4e-10  # Dynamo mocker's T^2 coefficient x 2
    step_base_s: float = 0.012  # llm-d-inference-sim's inter-token latency
    step_per_seq_s: float = 0.0
    step_per_kv_token_s: float = 0.0
    max_batch_tokens: int = 8192
    kv_bytes_per_token: int = 128 * 1024  # Llama-3-8B, bf16
    bandwidths: Mapping[str, float] = field(
        default_factory=lambda: {t.label: bps for t, bps in DEFAULT_BANDWIDTH_BPS.items()}
    )


def fit_prefill(prior: CostParams, samples: Sequence[tuple[int, float]]) -> CostParams | None:
    """The prefill curve `overhead + per_token U + attention U^2 / 2` through cold, lone
    prompts (U tokens, TTFT s), as `prior` with those three coefficients replaced; None
    when the samples cannot fix a curve with no negative coefficient (one size, or noise).
    Three sizes or more fit all three terms; two (or a failed three-term fit) keep the
    prior's attention-to-per-token ratio; a failed two-term fit is None."""
    sizes = {n for n, _ in samples}
    if len(sizes) < 2:
        return None
    scale = float(max(sizes))  # tokens in units of the largest probe: a well-posed system
    ys = [t for _, t in samples]
    fit: tuple[float, float, float] | None = None
    if len(sizes) >= 3:
        three = _least_squares([(1.0, n / scale, (n / scale) ** 2 / 2.0) for n, _ in samples], ys)
        if three is not None:
            fit = (three[0], three[1] / scale, three[2] / scale**2)
    if fit is None or min(fit) < 0.0:
        ratio = prior.prefill_attention_s / prior.prefill_per_token_s * scale
        rows = [(1.0, n / scale + ratio * (n / scale) ** 2 / 2.0) for n, _ in samples]
        two = _least_squares(rows, ys)
        if two is not None:
            fit = (two[0], two[1] / scale, ratio * two[1] / scale**2)
    if fit is None or min(fit) < 0.0 or fit[1] <= 0.0:
        return None
    overhead, per_token, attention = fit
    return replace(
        prior,
        prefill_overhead_s=overhead,
        prefill_per_token_s=per_token,
        prefill_attention_s=attention,
    )


def _least_squares(
    rows: Sequence[Sequence[float]], ys: Sequence[float]
) -> tuple[float, ...] | None:
    """Ordinary least squares through the normal equations (2 or 3 unknowns, Gaussian
    elimination with partial pivoting); None when they are singular."""
    k = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    b = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(k)]
    for col in range(k):
        pivot = max(range(col, k), key=lambda i: abs(a[i][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        b[col], b[pivot] = b[pivot], b[col]
        for i in range(col + 1, k):
            f = a[i][col] / a[col][col]
            for j in range(col, k):
                a[i][j] -= f * a[col][j]
            b[i] -= f * b[col]
    x = [0.0] * k
    for i in reversed(range(k)):
        x[i] = (b[i] - sum(a[i][j] * x[j] for j in range(i + 1, k))) / a[i][i]
    return tuple(x)


class Prediction(NamedTuple):
    """One instance's predicted TTFT and its parts, in seconds. (A named tuple: one is made
    per candidate per decision, and a tuple is the cheapest immutable record to build.)"""

    ttft_s: float
    queue_wait_s: float
    load_s: float  # tier load time not hidden behind the queue wait
    prefill_s: float  # own prefill, decode interference included
    compute_s: float  # uncalibrated GPU time (queue + prefill), what calibration scales
    work_s: float = 0.0  # GPU time this request adds to the instance (calibrated)
    # waiting for one of the engine's running-sequence slots (max_num_seqs) to free up,
    # which decode speed sets, not prefill: not scaled by the calibrated speed factor
    slot_wait_s: float = 0.0

    def imposed_delay_s(self, arrivals_per_s: float) -> float:
        """First-order delay this request's GPU work w imposes on later arrivals at the same
        instance (prefill is first come, first served): those arriving while it waits
        (rate x queue_wait) are delayed by all of w, those during its prefill by w/2."""
        w = self.work_s
        return arrivals_per_s * (self.queue_wait_s * w + w * w / 2.0)

    def parts(self) -> dict[str, float]:
        return {
            "queue_wait_s": self.queue_wait_s,
            "load_s": self.load_s,
            "prefill_s": self.prefill_s,
            "slot_wait_s": self.slot_wait_s,
        }


class ArrivalRate:
    """Arrivals per second, exponentially decayed over `window_s` (O(1) per event)."""

    def __init__(self, window_s: float = 30.0) -> None:
        if window_s <= 0:
            raise PolicyConfigError("window_s must be positive")
        self.window_s = window_s
        self._count = 0.0
        self._last: float | None = None
        self._first: float | None = None

    def tick(self, now: float) -> None:
        if self._last is not None and now > self._last:
            self._count *= math.exp(-(now - self._last) / self.window_s)
        if self._first is None:
            self._first = now
        self._last = max(now, self._last if self._last is not None else now)
        self._count += 1.0

    def rate(self, now: float) -> float:
        if self._last is None or self._first is None:
            return 0.0
        count = self._count * math.exp(-max(0.0, now - self._last) / self.window_s)
        span = now - self._first
        if span >= self.window_s:
            return count / self.window_s
        # before a whole window has passed: arrivals after the first over the time observed
        # (a lone first arrival says nothing about the rate)
        return max(0.0, count - 1.0) / max(span, 1e-3)


class ReuseBudget:
    """How much cached prompt the ttft policy may give up by choice: at most `budget` of the
    prompt tokens it routes, enforced two ways.

    - A price, set by dual ascent: `price` (a multiple of the recompute time of the tokens
      given up) rises while the recent token-weighted share of given-up tokens is over the
      budget and falls (to zero at least, `price_max` at most) while under it. TTFT is
      minimised subject to the budget, softly.
    - An allowance (a token bucket refilled by `budget` x each prompt, holding at most
      `burst_prompts` prompts' worth), which the policy makes a hard limit while the fleet
      is saturated: then giving up cache only adds work that nobody has room for.
    """

    def __init__(
        self,
        budget: float = 0.005,
        step: float = 0.05,
        alpha: float = 0.01,
        *,
        price_max: float = 10.0,
        burst_prompts: float = 2.0,
    ) -> None:
        if budget <= 0 or price_max < 0 or burst_prompts < 0:
            raise PolicyConfigError("budget must be positive, price_max and burst_prompts >= 0")
        self.budget = budget
        self.step = step
        self.alpha = alpha
        self.price_max = price_max
        self.burst_prompts = burst_prompts
        self.price = 0.0
        self.allowance = 0.0
        self._lost = 0.0
        self._prompt = 0.0

    def refill(self, prompt_tokens: int) -> None:
        """A request arrives: the allowance grows by its share of the budget."""
        cap = self.burst_prompts * prompt_tokens
        self.allowance = min(self.allowance + self.budget * prompt_tokens, cap)

    def permits(self, lost_tokens: int) -> bool:
        return lost_tokens <= max(0.0, self.allowance)

    def update(self, lost_tokens: int, prompt_tokens: int) -> None:
        """The choice made gave up `lost_tokens` of a `prompt_tokens` prompt's cache."""
        a = self.alpha
        self._lost += a * (max(0, lost_tokens) - self._lost)
        self._prompt += a * (max(0, prompt_tokens) - self._prompt)
        share = self._lost / self._prompt if self._prompt > 0 else 0.0
        step = self.step * (share - self.budget) / self.budget
        self.price = min(self.price_max, max(0.0, self.price + step))
        floor = -self.burst_prompts * prompt_tokens
        self.allowance = max(floor, self.allowance - max(0, lost_tokens))

    @property
    def lost_share(self) -> float:
        return self._lost / self._prompt if self._prompt > 0 else 0.0


_HBM = Tier.HBM.label
# a tier a hand-written `bandwidths` map leaves out (not one of the contracts' figures)
_UNLISTED_BPS = 1e9


class _InstanceModel:
    __slots__ = (
        "ctx_mean",
        "fits",
        "k",
        "k_prior",
        "n",
        "s_xx",
        "s_xy",
        "samples",
        "uncached_frac",
        "w_prior",
    )

    def __init__(self, prior_weight: float) -> None:
        self.s_xx = 0.0  # sum(l^i x^2) over outcomes
        self.s_xy = 0.0  # sum(l^i x y)
        self.n = 0.0  # sum(l^i): outcomes remembered
        self.w_prior = prior_weight  # the prior's weight in outcomes, decaying
        self.k_prior = 1.0  # its own data-only fit, sum(l^i x y) / sum(l^i x^2)
        self.k = 1.0  # kept current by `observe`
        self.fits = 0  # (prediction, observed TTFT) pairs learnt from
        self.uncached_frac = 1.0
        self.ctx_mean = 0.0
        self.samples = 0


class TtftCostModel:
    """Per-instance TTFT predictions, calibrated online."""

    def __init__(
        self,
        params: CostParams | None = None,
        *,
        forgetting: float = 0.98,
        prior_weight: float = 2.0,
        prior_decay: float = 0.7,
        stats_alpha: float = 0.05,
    ) -> None:
        if not 0.0 < forgetting <= 1.0:
            raise PolicyConfigError("forgetting must be in (0, 1]")
        if prior_weight < 0 or not 0.0 <= prior_decay <= 1.0:
            raise PolicyConfigError("prior_weight must be >= 0 and prior_decay in [0, 1]")
        self.params = params or CostParams()
        self.forgetting = forgetting
        self.prior_weight = prior_weight
        self.prior_decay = prior_decay
        self.stats_alpha = stats_alpha
        self._batch_tokens = max(1, self.params.max_batch_tokens)
        self._bandwidths: dict[str, dict[str, float]] = {}
        self._params: dict[str, CostParams] = {}  # an instance's own, from its join probe
        self._models: dict[str, _InstanceModel] = {}
        # read (never written) for instances with no outcome yet, so predicting stores nothing
        self._unobserved = _InstanceModel(prior_weight)
        # An instance not yet observed borrows the fleet's fastest factor (see `_refit`):
        # the profile's k = 1 may be far off (another GPU, a CPU engine, a time-scaled
        # simulator) once the others have converged.
        self._pooled_k = 1.0

    # -- inputs -------------------------------------------------------------------------

    def set_bandwidths(self, instance: str, bandwidths: Mapping[str, float]) -> None:
        """Measured bytes/s into `instance`'s HBM per tier label ("host", "array", "snapshot")."""
        current = self._bandwidths.setdefault(instance, {})
        for label, bps in bandwidths.items():
            if bps > 0 and math.isfinite(bps):
                current[label] = float(bps)

    def bandwidth(self, instance: str, label: str) -> float:
        own = self._bandwidths.get(instance)
        if own is not None and label in own:
            return own[label]
        return self.params.bandwidths.get(label, _UNLISTED_BPS)

    def _model(self, instance: str) -> _InstanceModel:
        m = self._models.get(instance)
        if m is None:
            m = self._models[instance] = _InstanceModel(self.prior_weight)
        return m

    def speed_factor(self, instance: str) -> float:
        """k: observed TTFT per predicted second of compute on `instance` (1 = the profile)."""
        m = self._models.get(instance)
        if m is None or m.fits == 0:
            return self._pooled_k
        return m.k

    def recompute_s_per_token(self, instance: str) -> float:
        """Seconds `instance` takes to compute one more prompt token, as calibrated: its own
        prefill curve (from its join probe, else the profile's) times its speed factor, as
        `predict` prices its prefill. The unit of everything the `ttft` policy charges for
        recomputing KV (the reuse price, KV pushed out): never the prior's own, which may be
        an engine several times faster or slower than the one recomputing."""
        p = self._params.get(instance, self.params)
        return self.speed_factor(instance) * p.prefill_per_token_s

    # -- the model ----------------------------------------------------------------------

    def predict(
        self,
        instance: str,
        *,
        prompt_tokens: int,
        cached_tokens_by_tier: Mapping[str, int],
        in_flight: int,
        queued_prefill_tokens: int,
    ) -> Prediction:
        # Runs once per candidate per decision: the helpers above are inlined (same formulas)
        # and builtins avoided because this is the hot loop of the default policy
        # (`warmgate bench router`).
        p = self._params.get(instance, self.params)
        m = self._models.get(instance)
        if m is None:  # not observed yet: the profile's prior, nothing stored
            m = self._unobserved
        k = m.k if m.fits else self._pooled_k
        cached = 0
        load = 0.0
        for label, tokens in cached_tokens_by_tier.items():
            cached += tokens
            if tokens > 0 and label != _HBM:
                load += tokens * p.kv_bytes_per_token / self.bandwidth(instance, label)
        if cached > prompt_tokens:
            cached = prompt_tokens
        elif cached < 0:
            cached = 0
        uncached = prompt_tokens - cached
        if uncached < 1:
            uncached = 1
        queued = queued_prefill_tokens
        # seconds per uncached token of queued work, at this instance's typical context
        queue_c = queued * (p.prefill_per_token_s + p.prefill_attention_s * m.ctx_mean)
        u = float(uncached)
        prefill_c = (
            p.prefill_overhead_s
            + p.prefill_per_token_s * u
            + p.prefill_attention_s * u * (cached + u / 2.0)
        )
        if in_flight > 0:
            ctx = m.ctx_mean if m.samples else float(prompt_tokens)
            steps = -(-(queued + uncached) // self._batch_tokens)  # ceil
            step_s = (
                p.step_base_s
                + p.step_per_seq_s * in_flight
                + p.step_per_kv_token_s * in_flight * ctx
            )
            prefill_c += steps * step_s  # decode interference: chunked prefill shares steps
        queue_s = k * queue_c
        prefill_s = k * prefill_c
        visible_load = load - queue_s if load > queue_s else 0.0
        return Prediction(
            queue_s + visible_load + prefill_s,
            queue_s,
            visible_load,
            prefill_s,
            queue_c + prefill_c,
            prefill_s,
        )

    # -- calibration --------------------------------------------------------------------

    def observe(
        self,
        instance: str,
        *,
        prompt_tokens: int,
        cached_tokens: int,
        ttft_s: float | None,
        prediction: Prediction | None,
    ) -> None:
        """Learn from one finished request. Without a prediction of ours (a request routed
        before we knew it) only the running means move."""
        m = self._model(instance)
        a = self.stats_alpha
        if prompt_tokens > 0:
            frac = max(0.0, min(1.0, 1.0 - cached_tokens / prompt_tokens))
            m.uncached_frac += a * (frac - m.uncached_frac)
            ctx = float(prompt_tokens)
            m.ctx_mean = ctx if m.samples == 0 else m.ctx_mean + a * (ctx - m.ctx_mean)
            m.samples += 1
        if ttft_s is None or prediction is None or prediction.compute_s <= 0.0:
            return
        if prediction.slot_wait_s > 0.0:
            # a wait for a running slot is decode's doing: its error says nothing of k
            return
        x = prediction.compute_s
        # what the prediction would have been at k = 1: TTFT minus the load left visible
        y = max(0.0, ttft_s - prediction.load_s)
        lam = self.forgetting
        if m.fits:
            m.w_prior *= self.prior_decay
        m.s_xx = lam * m.s_xx + x * x
        m.s_xy = lam * m.s_xy + x * y
        m.n = lam * m.n + 1.0
        m.fits += 1
        fit = m.s_xy / m.s_xx if m.s_xx > 0.0 else 1.0
        m.k_prior = fit if fit > 1e-9 else 1e-9  # (k_prior holds the data-only fit)
        self._refit()

    def calibrate(self, instance: str, samples: Sequence[tuple[int, float]]) -> None:
        """The instance's join probe: (cold prompt tokens, observed TTFT) pairs measured on
        the idle instance. Their prefill curve, when it can be fitted, becomes the
        instance's (`fit_prefill`); each sample then enters the fit of k as an outcome
        predicted with nothing cached, queued or in flight; the prior's weight for the
        instance drops to zero (the probe measured the engine itself), and the running
        means the routed requests keep (context, uncached share) are left alone."""
        good = [(n, t) for n, t in samples if n > 0 and t > 0.0]
        curve = fit_prefill(self.params, good)
        if curve is not None:
            self._params[instance] = curve
        m = self._model(instance)
        lam = self.forgetting
        used = 0
        for prompt_tokens, ttft_s in good:
            x = self.predict(
                instance,
                prompt_tokens=prompt_tokens,
                cached_tokens_by_tier={},
                in_flight=0,
                queued_prefill_tokens=0,
            ).compute_s
            if x <= 0.0:
                continue
            m.s_xx = lam * m.s_xx + x * x
            m.s_xy = lam * m.s_xy + x * ttft_s
            m.n = lam * m.n + 1.0
            m.fits += 1
            used += 1
        if not used:
            return
        m.w_prior = 0.0
        fit = m.s_xy / m.s_xx if m.s_xx > 0.0 else 1.0
        m.k_prior = fit if fit > 1e-9 else 1e-9
        self._refit()

    def _refit(self) -> None:
        """Every observed instance's k: its own fit blended (in log space, so 100x too
        slow or too fast are equally far off) with its prior, the fastest fit among the
        others (1 = the profile when there is none). Optimistic on purpose: an instance
        believed slower than it is would never be chosen, so never observed and corrected;
        the fastest fit is what an unobserved one borrows for the same reason."""
        fitted = [(name, o) for name, o in self._models.items() if o.fits]
        fits = sorted((o.k_prior, name) for name, o in fitted)
        for name, o in fitted:
            others = next((f for f, n in fits if n != name), 1.0)
            w = o.w_prior
            o.k = math.exp((w * math.log(others) + o.n * math.log(o.k_prior)) / (w + o.n))
        self._pooled_k = fits[0][0] if fits else 1.0

    def snapshot(self) -> dict[str, dict[str, float]]:
        return {
            name: {
                "speed_factor": self.speed_factor(name),
                "uncached_fraction": m.uncached_frac,
                "mean_context_tokens": m.ctx_mean,
                "samples": float(m.samples),
            }
            for name, m in self._models.items()
        }
