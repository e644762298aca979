"""PNG plots of a comparison (matplotlib, Agg backend, no display needed).

- `ttft_cdf`: the empirical CDF of TTFT, one line per gateway (log x axis);
- `cached_by_tier`: per gateway, the share of prompt tokens served from cache, stacked by
  the tier the engine found them in (one bar "all tiers" when the engine does not split);
- `requests_over_time`: per gateway, requests completed per instance in 10-second bins of
  modelled time, from the engines' own counters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

TIER_ORDER = ("HBM", "l2", "array", "l3")
TIER_LABELS = {
    "HBM": "HBM (engine prefix cache)",
    "l2": "tierd L1 arena",
    "array": "shared array",
    "l3": "snapshots",
}


def ttft_cdf(
    ttfts: Mapping[str, Sequence[float]],
    out: Path,
    *,
    title: str,
    xlabel: str = "TTFT (s, modelled hardware)",
) -> Path:
    """CDF of TTFT per gateway."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, values in ttfts.items():
        if not values:
            continue
        xs = np.sort(np.asarray(values, dtype=float))
        ys = np.arange(1, len(xs) + 1) / len(xs)
        ax.step(xs, ys, where="post", label=f"{name} (n={len(xs)})")
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.0)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _tier_key(tier: str) -> tuple[int, str]:
    return (TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER), tier)


def cached_by_tier(
    ratios: Mapping[str, Mapping[str, float]],
    totals: Mapping[str, float | None],
    out: Path,
    *,
    title: str,
) -> Path:
    """Stacked bars: cached-token ratio per gateway, split by tier where known."""
    names = list(ratios)
    tiers = sorted({t for r in ratios.values() for t in r}, key=_tier_key)
    fig, ax = plt.subplots(figsize=(8, 5))
    bottom = np.zeros(len(names))
    if tiers:
        for tier in tiers:
            vals = np.asarray([ratios[n].get(tier, 0.0) for n in names])
            ax.bar(names, vals, bottom=bottom, label=TIER_LABELS.get(tier, tier))
            bottom += vals
    else:
        vals = np.asarray([totals.get(n) or 0.0 for n in names])
        ax.bar(names, vals, label="all tiers (engine gives no split)")
        bottom += vals
    for x, total in enumerate(bottom):
        ax.text(x, total, f"{total:.2f}", ha="center", va="bottom")
    ax.set_ylabel("cached prompt tokens / prompt tokens")
    ax.set_ylim(0, max(1.0, float(bottom.max(initial=0.0)) * 1.1))
    ax.legend(title="tier")
    ax.set_title(title, fontsize="medium")
    plt.setp(ax.get_xticklabels(), rotation=15, ha="right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _rebin(points: Sequence[tuple[float, float]], bin_s: float) -> tuple[list[float], list[float]]:
    """Sum (time, count) samples into bins of `bin_s` seconds; x = each bin's middle."""
    if not points:
        return [], []
    n = int(max(t for t, _ in points) // bin_s) + 1
    sums = [0.0] * n
    for t, v in points:
        sums[int(t // bin_s)] += v
    return [(k + 0.5) * bin_s for k in range(n)], sums


def requests_over_time(
    series: Mapping[str, Mapping[str, Sequence[tuple[float, float]]]],
    out: Path,
    *,
    title: str,
    time_scale: float = 1.0,
    bin_s: float = 10.0,
) -> Path:
    """One panel per gateway: requests completed per instance in each `bin_s`-second bin
    (modelled time)."""
    names = [n for n in series if series[n]]
    cols = min(3, max(1, len(names)))
    rows = max(1, -(-len(names) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False, sharey=True)
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names, strict=False):
        for inst, points in sorted(series[name].items()):
            xs, ys = _rebin([(t / time_scale, v) for t, v in points], bin_s)
            if xs:
                ax.plot(xs, ys, label=inst, linewidth=1.2, marker=".")
        ax.set_title(name)
        ax.set_xlabel("time (s, modelled)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    axes[0][0].set_ylabel(f"requests done / {bin_s:g} s")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
