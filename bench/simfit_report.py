"""How well the simulator predicts real runs (issue 24 item 5): the pure part of `warmgate
bench simfit`. Real figures come from `bench compare` results (one `results.json` per
repeat); each real gateway is mapped to a simulated configuration; per gateway and
percentile the error is `simulated / real - 1`, against the real median over repeats.

Ordering: every pair of gateways is compared by its real and its simulated figure. A pair
whose real gap is smaller than the real spread across repeats (max - min, the wider of the
two, the rule `bench compare --repeats` uses for a tie) is a tie and cannot be ordered
wrong; any other pair is concordant when the simulator puts them the same way round.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.errors import InputError

PERCENTILES = ("p50", "p90", "p99")


class RealResultsError(InputError, ValueError):
    """A real results file without the figures the comparison needs."""


@dataclass(frozen=True, slots=True)
class RealFigures:
    """One real gateway's TTFT percentiles, per repeat."""

    repeats: tuple[Mapping[str, float], ...]
    cached_ratio: tuple[float, ...] = ()

    def median(self, pct: str) -> float:
        return statistics.median(r[pct] for r in self.repeats)

    def spread(self, pct: str) -> float:
        values = [r[pct] for r in self.repeats]
        return max(values) - min(values)


@dataclass(frozen=True, slots=True)
class PairVerdict:
    a: str
    b: str
    pct: str
    verdict: str  # "same" | "reversed" | "tie"


@dataclass(slots=True)
class Ordering:
    pct: str
    real_order: list[str]
    sim_order: list[str]
    pairs: list[PairVerdict] = field(default_factory=list)

    @property
    def reversed_pairs(self) -> int:
        return sum(p.verdict == "reversed" for p in self.pairs)

    @property
    def same(self) -> bool:
        return self.reversed_pairs == 0


def read_real(paths: Sequence[Path]) -> dict[str, RealFigures]:
    """Each gateway's figures over the given `bench compare` results files: one a repeat, or
    a `--repeats N` run's file, whose `repeat_rows` are its repeats (its `gateways` are
    their medians, which would hide the spread)."""
    per: dict[str, list[dict[str, float]]] = {}
    cached: dict[str, list[float]] = {}
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            for gateways in data.get("repeat_rows") or [data["gateways"]]:
                for name, g in gateways.items():
                    figures = {p: float(g[f"ttft_{p}_s"]) for p in PERCENTILES}
                    per.setdefault(name, []).append(figures)
                    cached.setdefault(name, []).append(float(g.get("cached_token_ratio") or 0.0))
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise RealResultsError(f"{path}: not a bench compare results file ({exc})") from None
    return {n: RealFigures(tuple(r), tuple(cached[n])) for n, r in per.items()}


def relative_error(simulated: float, real: float) -> float:
    """simulated / real - 1 (0.25 = 25% too slow, -0.25 = 25% too fast)."""
    if real <= 0:
        raise RealResultsError(f"a real figure must be positive, got {real}")
    return simulated / real - 1.0


def errors(
    real: Mapping[str, RealFigures], sim: Mapping[str, Mapping[str, float]]
) -> dict[str, Any]:
    """Per gateway: real median, simulated and error for each percentile."""
    out: dict[str, Any] = {}
    for name, fig in real.items():
        if name not in sim:
            continue
        out[name] = {
            pct: {
                "real": fig.median(pct),
                "real_spread": fig.spread(pct),
                "simulated": sim[name][pct],
                "error": relative_error(sim[name][pct], fig.median(pct)),
            }
            for pct in PERCENTILES
        }
    return out


def ordering(
    real: Mapping[str, RealFigures], sim: Mapping[str, Mapping[str, float]], pct: str
) -> Ordering:
    """The real and simulated order of the gateways by one percentile, and every pair's verdict."""
    names = [n for n in real if n in sim]
    result = Ordering(
        pct,
        sorted(names, key=lambda n: real[n].median(pct)),
        sorted(names, key=lambda n: sim[n][pct]),
    )
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            gap = real[a].median(pct) - real[b].median(pct)
            spread = max(real[a].spread(pct), real[b].spread(pct))
            sim_gap = sim[a][pct] - sim[b][pct]
            if abs(gap) <= spread or gap == 0:
                verdict = "tie"
            elif sim_gap == 0 or (gap > 0) != (sim_gap > 0):
                verdict = "reversed"
            else:
                verdict = "same"
            result.pairs.append(PairVerdict(a, b, pct, verdict))
    return result


def within(errs: Mapping[str, Any], pcts: Sequence[str], bound: float) -> bool:
    """Whether every gateway's error at each of `pcts` is within +-bound."""
    return all(abs(e[p]["error"]) <= bound for e in errs.values() for p in pcts)


def markdown(
    errs: Mapping[str, Any], orders: Sequence[Ordering], mapping: Mapping[str, str]
) -> str:
    lines = [
        "| real gateway | simulated as | real p50 / p90 / p99 s (median) "
        "| real spread over repeats, of the median | simulated p50 / p90 / p99 s "
        "| error p50 / p90 / p99 |",
        "|---|---|---|---|---|---|",
    ]
    for name, e in errs.items():
        real = " / ".join(f"{e[p]['real']:.2f}" for p in PERCENTILES)
        spread = " / ".join(f"{100 * e[p]['real_spread'] / e[p]['real']:.0f}%" for p in PERCENTILES)
        simulated = " / ".join(f"{e[p]['simulated']:.2f}" for p in PERCENTILES)
        err = " / ".join(f"{100 * e[p]['error']:+.0f}%" for p in PERCENTILES)
        lines.append(
            f"| {name} | {mapping.get(name, '?')} | {real} | {spread} | {simulated} | {err} |"
        )
    lines.append("")
    for o in orders:
        counts = {v: sum(p.verdict == v for p in o.pairs) for v in ("same", "reversed", "tie")}
        lines.append(
            f"- {o.pct} order, real: {' < '.join(o.real_order)}; simulated: "
            f"{' < '.join(o.sim_order)}; pairs same {counts['same']}, reversed "
            f"{counts['reversed']}, tie by the real spread {counts['tie']}"
        )
        for p in o.pairs:
            if p.verdict == "reversed":
                lines.append(f"  - reversed: {p.a} vs {p.b}")
    return "\n".join(lines)
