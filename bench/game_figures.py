"""What a game server's hints did in one gateway's replay (issue 22): TTFT of the dialogues'
first lines (the ones a game server warms: items with a warm lead), of each priority class,
and of the lines in the window after each world-version bump; for warmed first lines, the
share of the warmed full blocks the line found cached.

Every gateway of a comparison replays the same items (the same first lines, barks and bumps);
only the `-game` runs send the hints (bench.peers), so a `-game` run's figures against the
same policy's plain run are the hints' effect, measured in the same comparison."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from bench.replay import ReplayItem, RequestRecord
from bench.report import pct

BUMP_WINDOW_S = 30.0  # "the 30 s after a world bump" (issue 22's measure)


def _ttft(records: Sequence[RequestRecord], k: float) -> dict[str, Any]:
    ttft = [r.ttft_s * k for r in records if r.ok and r.ttft_s is not None]
    p50, p99 = pct(ttft, 50), pct(ttft, 99)
    return {
        "n": len(ttft),
        "failed": sum(1 for r in records if r.sent and not r.ok),
        "ttft_p50_s": None if p50 is None else round(p50, 4),
        "ttft_p99_s": None if p99 is None else round(p99, 4),
    }


def game_figures(
    items: Sequence[ReplayItem],
    records: Sequence[RequestRecord],
    *,
    block_tokens: int,
    time_scale: float = 1.0,
    compress: float = 1.0,
    bump_at_s: Sequence[float] = (),
) -> dict[str, Any] | None:
    """The figures above, None for a workload without hints (no warm lead, class or bump)."""
    first = [i for i, it in enumerate(items) if it.warm_lead_s]
    classes = sorted({it.priority for it in items if it.priority})
    if not first and not classes and not bump_at_s:
        return None
    k = 1.0 / time_scale
    sent = [r for r in records if r.sent]
    out: dict[str, Any] = {}
    if first:
        lines = [records[i] for i in first if records[i].sent]
        warmed = [r for r in lines if r.warm is not None and r.warm.get("status") == 200]
        refused = [r for r in lines if r.warm is not None and r.warm.get("status") != 200]
        out["first_lines"] = _ttft(lines, k) | {
            "warmed": len(warmed),
            "warms_refused": len(refused),
            "warm_sources": dict(Counter(str(r.warm.get("source")) for r in warmed if r.warm)),
        }
        ratios = [x for r in warmed if (x := _cached_share(r, block_tokens)) is not None]
        out["first_lines"]["cached_over_warmed_blocks"] = (
            round(sum(ratios) / len(ratios), 4) if ratios else None
        )
    if classes:
        out["classes"] = {
            c: _ttft([records[i] for i, it in enumerate(items) if it.priority == c], k)
            for c in classes
        }
    if bump_at_s:
        t0 = min((it.at_s for it in items), default=0.0)
        windows = [((b - t0) / compress, (b - t0 + BUMP_WINDOW_S) / compress) for b in bump_at_s]
        after = [r for r in sent if any(a <= r.scheduled_s < z for a, z in windows)]
        out["after_bumps"] = _ttft(after, k) | {"window_s": BUMP_WINDOW_S}
    return out


def _cached_share(record: RequestRecord, block_tokens: int) -> float | None:
    """The line's cached tokens over the full blocks of the context its warm made resident."""
    assert record.warm is not None
    prompt = int(record.warm.get("prompt_tokens") or 0)
    full = (prompt - 1) // block_tokens * block_tokens  # a prompt's last token is never cached
    if full <= 0 or record.cached_tokens is None:
        return None
    return min(1.0, record.cached_tokens / full)


def game_markdown(rows: dict[str, dict[str, Any]]) -> str:
    """One table of the gateways' game figures (those that have them)."""
    have = {gw: s["game"] for gw, s in rows.items() if s.get("game")}
    if not have:
        return ""
    lines = [
        "## What the game server's hints did (first lines, classes, after world bumps)", "",
        "Every gateway replays the same lines; `-game` runs also send the hints (a warm ahead "
        "of each dialogue's first line, `x-warmgate-priority`).", "",
        "| gateway | first lines n | p50 / p99 s | warmed / refused | cached / warmed blocks "
        "| classes p50 / p99 s | after bumps n | p50 / p99 s |",
        "|---|---:|---|---|---:|---|---:|---|",
    ]  # fmt: skip
    for gw, g in have.items():
        f = g.get("first_lines") or {}
        b = g.get("after_bumps") or {}
        classes = "; ".join(
            f"{c} {v['ttft_p50_s']} / {v['ttft_p99_s']} (n {v['n']})"
            for c, v in (g.get("classes") or {}).items()
        )
        lines.append(
            f"| {gw} | {f.get('n', '')} | {f.get('ttft_p50_s', '')} / {f.get('ttft_p99_s', '')} "
            f"| {f.get('warmed', '')} / {f.get('warms_refused', '')} "
            f"| {f.get('cached_over_warmed_blocks', '')} | {classes} | {b.get('n', '')} "
            f"| {b.get('ttft_p50_s', '')} / {b.get('ttft_p99_s', '')} |"
        )
    return "\n".join(lines) + "\n"
