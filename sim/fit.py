"""Fit a timing profile (`sim.profiles.Profile`) to measurements of a real engine: the pure
arithmetic of `warmgate bench simfit` (issue 24 item 5).

Prefill. A sample is one lone prompt: `uncached` tokens computed after `cached` ones, timed
from send to first token. The engine computes it in chunks of at most `chunk_tokens` (vLLM's
`max_num_batched_tokens`), one scheduler step each, and the simulator charges each step
`prefill_seconds(chunk, context before it)` (sim.cluster.probe does the same for the join
probe), so the model of a sample is linear in the profile's three prefill figures:

    ttft = overhead * steps + per_token * uncached + attention * sum(chunk * (ctx + chunk / 2))

fitted by least squares with every figure >= 0 (each subset of the three is solved and the
best non-negative one kept: three unknowns, eight subsets).

Decode. A sample is `batch` streams decoding together, their KV totalling `kv_tokens`, one
step taking `step_s`: `step = base + per_seq * batch + per_kv_token * kv_tokens`, fitted the
same way.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from contracts.errors import InputError


class FitInputError(InputError, ValueError):
    """Too few or malformed samples to fit a profile figure."""


@dataclass(frozen=True, slots=True)
class PrefillSample:
    uncached: int  # tokens computed
    cached: int  # tokens of context already in the cache
    ttft_s: float


@dataclass(frozen=True, slots=True)
class DecodeSample:
    batch: int
    kv_tokens: int
    step_s: float


@dataclass(frozen=True, slots=True)
class LinearFit:
    coefficients: tuple[float, ...]
    rms_relative_error: float  # sqrt(mean((predicted / observed - 1)^2)) over the samples
    samples: int


def prefill_features(uncached: int, cached: int, chunk_tokens: int) -> tuple[float, float, float]:
    """(steps, tokens, attention pairs) of one prompt computed in chunks of `chunk_tokens`."""
    if chunk_tokens <= 0:
        raise FitInputError("chunk_tokens must be positive")
    steps, pairs = 0, 0.0
    done = 0
    left = max(1, uncached)  # an engine always computes at least the last token
    while done < left:
        chunk = min(chunk_tokens, left - done)
        pairs += chunk * (cached + done + chunk / 2.0)
        done += chunk
        steps += 1
    return float(steps), float(left), pairs


def _solve(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float] | None:
    """Least squares of y ~ rows (normal equations, Gauss-Jordan); None when singular."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    b = [sum(r[i] * v for r, v in zip(rows, y, strict=True)) for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        b[col], b[pivot] = b[pivot], b[col]
        for r in range(n):
            if r != col and a[r][col] != 0.0:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * c for x, c in zip(a[r], a[col], strict=True)]
                b[r] -= f * b[col]
    return [b[i] / a[i][i] for i in range(n)]


def nonnegative_least_squares(rows: Sequence[Sequence[float]], y: Sequence[float]) -> LinearFit:
    """The best fit of y ~ rows with every coefficient >= 0, weighting each sample by
    1 / y (so a long prompt does not drown a short one: relative error is what matters)."""
    if not rows or len(rows) != len(y):
        raise FitInputError("no samples to fit, or rows and observations differ in number")
    if any(v <= 0 or not math.isfinite(v) for v in y):
        raise FitInputError("every observed time must be positive and finite")
    n = len(rows[0])
    weighted = [[x / v for x in r] for r, v in zip(rows, y, strict=True)]
    ones = [1.0] * len(y)
    best: tuple[float, list[float]] | None = None
    for k in range(n, 0, -1):
        for subset in itertools.combinations(range(n), k):
            sol = _solve([[r[i] for i in subset] for r in weighted], ones)
            if sol is None or any(c < 0 for c in sol):
                continue
            coef = [0.0] * n
            for i, c in zip(subset, sol, strict=True):
                coef[i] = c
            err = _rms_relative(rows, y, coef)
            if best is None or err < best[0] - 1e-12:
                best = (err, coef)
    if best is None:
        raise FitInputError("no non-negative fit exists for these samples")
    return LinearFit(tuple(best[1]), best[0], len(y))


def _rms_relative(
    rows: Sequence[Sequence[float]], y: Sequence[float], coef: Sequence[float]
) -> float:
    errs = [
        (sum(c * x for c, x in zip(coef, r, strict=True)) / v - 1.0) ** 2
        for r, v in zip(rows, y, strict=True)
    ]
    return math.sqrt(sum(errs) / len(errs))


def fit_prefill(samples: Sequence[PrefillSample], chunk_tokens: int) -> LinearFit:
    """(overhead s per step, s per token, s per attention pair) from lone prompts."""
    if len(samples) < 3:
        raise FitInputError(f"need at least 3 prefill samples, got {len(samples)}")
    rows = [prefill_features(s.uncached, s.cached, chunk_tokens) for s in samples]
    return nonnegative_least_squares(rows, [s.ttft_s for s in samples])


def fit_decode(samples: Sequence[DecodeSample]) -> LinearFit:
    """(step base s, s per sequence, s per KV token) from decode steps."""
    if len(samples) < 2:
        raise FitInputError(f"need at least 2 decode samples, got {len(samples)}")
    rows = [(1.0, float(s.batch), float(s.kv_tokens)) for s in samples]
    return nonnegative_least_squares(rows, [s.step_s for s in samples])


def predicted_prefill_s(fit: LinearFit, uncached: int, cached: int, chunk_tokens: int) -> float:
    """What a prefill fit predicts for one lone prompt."""
    feats = prefill_features(uncached, cached, chunk_tokens)
    return sum(c * x for c, x in zip(fit.coefficients, feats, strict=True))


def slowdown(observed: Sequence[float], predicted: Sequence[float]) -> float:
    """The median of observed / predicted: how much slower a condition (two engines busy
    at once) runs than the lone fit says."""
    if not observed or len(observed) != len(predicted):
        raise FitInputError("slowdown wants as many predictions as observations, at least one")
    ratios = sorted(o / p for o, p in zip(observed, predicted, strict=True) if p > 0)
    if not ratios:
        raise FitInputError("no positive prediction to compare with")
    mid = len(ratios) // 2
    return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2.0
