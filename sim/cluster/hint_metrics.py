"""Figures of the game server's hints in one cluster run (issue 22's measures, at scale):
TTFT of the dialogues' first lines (the trace's records with a warm lead) and of every
other request (the warms' neighbours), per priority class, and of the requests arriving in
the window after each world bump; the warms by kind and outcome, and for each first line
whose warm made its blocks resident, the share of the warmed full blocks the line found
cached. Classes and first lines are the trace's, whether or not the run acted on them, so
the same figures of a run with a hint and one without compare the same requests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from sim.cluster.hints import HintedSimulator
from sim.cluster.request import SimRequest
from sim.traces import TraceRequest


def ttft_figures(requests: Sequence[SimRequest]) -> dict[str, Any]:
    """n, p50, p99 and mean TTFT of the requests that got a first token."""
    ttft = np.asarray([r.ttft_s for r in requests if r.ttft_s is not None], dtype=np.float64)
    if not len(ttft):
        return {"n": 0, "ttft_p50_s": None, "ttft_p99_s": None, "ttft_mean_s": None}
    return {
        "n": len(ttft),
        "ttft_p50_s": float(np.percentile(ttft, 50)),
        "ttft_p99_s": float(np.percentile(ttft, 99)),
        "ttft_mean_s": float(ttft.mean()),
    }


def hint_figures(
    trace: Sequence[TraceRequest],
    requests: Sequence[SimRequest],
    sim: HintedSimulator | None,
    *,
    block_tokens: int,
    bumps_s: Sequence[float] = (),
    bump_window_s: float = 0.0,
) -> dict[str, Any]:
    """The module docstring's figures; `requests` by trace index as `RunRecord` has them
    (sorted by arrival: matched by `idx`), `sim` None for a run of the plain simulator."""
    by_idx = {r.idx: r for r in requests}
    shed = sim.shed if sim is not None else set()
    served = [r for r in requests if r.idx not in shed]
    first = {i for i, t in enumerate(trace) if t.warm_lead_ms and t.warm_blocks and t.session}
    out: dict[str, Any] = {
        "first_lines": ttft_figures([r for r in served if r.idx in first]),
        "other_lines": ttft_figures([r for r in served if r.idx not in first]),
        "all": ttft_figures(served),
    }
    classes = sorted({t.priority for t in trace if t.priority})
    out["classes"] = {
        c: ttft_figures([r for r in served if trace[r.idx].priority == c])
        | {"shed": sum(1 for i in shed if trace[i].priority == c)}
        for c in classes
    }
    if bumps_s:
        after = [r for r in served if any(b <= r.arrival_s < b + bump_window_s for b in bumps_s)]
        out["after_bumps"] = ttft_figures(after) | {
            "window_s": bump_window_s,
            "bumps_s": list(bumps_s),
        }
    if sim is None:
        return out
    tally: Counter[tuple[str, str]] = Counter((w.kind, w.outcome) for w in sim.warms)
    kinds: dict[str, dict[str, int]] = {}
    for (kind, outcome), n in sorted(tally.items()):
        kinds.setdefault(kind, {})[outcome] = n
    shares = []
    for w in sim.warms:
        if w.kind == "first_line" and w.outcome in ("done", "held") and w.target is not None:
            line = by_idx.get(w.target)
            full = len(w.chain) * block_tokens
            if line is not None and line.admitted and full > 0:
                shares.append(min(1.0, line.cached_tokens / full))
    out["warms"] = {
        "by_kind": kinds,
        "busy_s": sum(q.busy_s for q in sim.queues),
        "cached_over_warmed_blocks": float(np.mean(shares)) if shares else None,
        "warmed_lines": len(shares),
    }
    out["versions"] = dict(Counter(v["trigger"] for v in sim.versions))
    return out
