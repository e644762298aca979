"""`bench compare --repeats N`: what N rotated repeats of the same comparison say together.

Each repeat runs every gateway on fresh engines, the gateways' order rotated by one each
repeat (`rotated`), so no gateway always runs first (cold machine) or last. From the repeats'
rows (`{gateway: summary}` per repeat) this module computes, purely:

- `median_rows`: each figure's median across repeats, per gateway (the rows the report's
  main table and the plots show);
- `peer_ratios`: for each of warmgate's gateways and each peer, the median across repeats of
  ours / peer for the TTFT figures, and against the best (lowest) peer of each group (peers
  at their defaults; `-tuned` peers) within the same repeat;
- `ties`: a figure whose spread across repeats (max - min) of either gateway is larger than
  the difference between the two gateways' medians is a tie, not a lead;
- `load_flags`: a run whose machine load (1-minute load average, mean over the replay)
  differs from the median of the other runs' by more than `margin` (0.5: 50%) is flagged;
- `target_check`: the issue's targets on those median ratios.

`merge_results` joins results.json files of separate `--repeats 1` invocations (each under
the heavy lock on its own, with `--rotate-offset` 0, 1, 2) into one repeated result;
`join_partial` makes one repeat of a run cut short and the run of the gateways it missed.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from bench.peers import REFERENCE_GATEWAYS

RATIO_FIGURES = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s")
LOAD_FIGURE = "machine_load_mean"
DEFAULT_LOAD_MARGIN = 0.5  # a run whose load is >50% off the other runs' median is flagged
# issue 24's targets on the median ratio to the best peer: (group, figure) -> at most
TARGETS: dict[tuple[str, str], float] = {
    ("defaults", "ttft_p50_s"): 0.5,
    ("defaults", "ttft_p90_s"): 0.4,
    ("defaults", "ttft_p99_s"): 0.4,
    ("tuned", "ttft_p50_s"): 0.8,
    ("tuned", "ttft_p90_s"): 0.8,
    ("tuned", "ttft_p99_s"): 0.8,
}
Rows = Mapping[str, Mapping[str, Any]]


def rotated(names: Sequence[str], k: int) -> list[str]:
    """`names` rotated left by `k` (repeat k runs gateway k first)."""
    if not names:
        return []
    k %= len(names)
    return [*names[k:], *names[:k]]


def _ran(rows: Rows) -> dict[str, Mapping[str, Any]]:
    return {n: r for n, r in rows.items() if not r.get("skipped")}


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def median_rows(repeats: Sequence[Rows]) -> dict[str, dict[str, Any]]:
    """Per gateway, each numeric figure's median over the repeats it ran in (other fields
    from its first run; a gateway skipped in every repeat keeps its first skip)."""
    names: list[str] = []
    for rows in repeats:
        names += [n for n in rows if n not in names]
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        runs = [rows[name] for rows in repeats if name in rows and not rows[name].get("skipped")]
        if not runs:
            out[name] = dict(next(rows[name] for rows in repeats if name in rows))
            continue
        row: dict[str, Any] = dict(runs[0])
        for key in runs[0]:
            values = [r[key] for r in runs if _number(r.get(key))]
            if values and len(values) == len(runs):
                med = statistics.median(values)
                if all(isinstance(v, int) for v in values) and float(med).is_integer():
                    med = int(med)  # counts stay counts (two runs' median is a float)
                row[key] = round(med, 4) if isinstance(med, float) else med
        row["repeats_ran"] = len(runs)
        out[name] = row
    return out


def spread(repeats: Sequence[Rows], name: str, figure: str) -> float | None:
    """max - min of `figure` over the repeats gateway `name` ran in."""
    values = [
        float(rows[name][figure])
        for rows in repeats
        if name in rows and _number(rows[name].get(figure))
    ]
    return max(values) - min(values) if values else None


def groups(names: Sequence[str], ours: Sequence[str]) -> dict[str, list[str]]:
    """Peers by configuration: `defaults` (as installed) and `tuned` (`-tuned` names); a
    reference gateway (`floor`) is in a group of its own, never the best of the peers."""
    peers = [n for n in names if n not in ours and n not in REFERENCE_GATEWAYS]
    return {
        "defaults": [n for n in peers if not n.endswith("-tuned")],
        "tuned": [n for n in peers if n.endswith("-tuned")],
        "reference": [n for n in names if n in REFERENCE_GATEWAYS],
    }


def _ratio(a: Any, b: Any) -> float | None:
    return float(a) / float(b) if _number(a) and _number(b) and float(b) > 0 else None


def _median(values: Sequence[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return round(statistics.median(vs), 3) if vs else None


def peer_ratios(
    repeats: Sequence[Rows], ours: Sequence[str], peer_groups: Mapping[str, Sequence[str]]
) -> dict[str, dict[str, dict[str, float | None]]]:
    """{our gateway: {peer or `best <group>`: {figure: median over repeats of ours/peer}}};
    the best of a group is, in each repeat and for each figure, its lowest peer."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    peers = [p for g in peer_groups.values() for p in g]
    for mine in ours:
        per: dict[str, dict[str, float | None]] = {}
        for peer in peers:
            per[peer] = {
                f: _median(
                    [
                        _ratio(_ran(rows).get(mine, {}).get(f), _ran(rows).get(peer, {}).get(f))
                        for rows in repeats
                    ]
                )
                for f in RATIO_FIGURES
            }
        for group, members in peer_groups.items():
            if not members:
                continue
            figs: dict[str, float | None] = {}
            for f in RATIO_FIGURES:
                per_repeat = []
                for rows in repeats:
                    ran = _ran(rows)
                    best = [ran[p][f] for p in members if p in ran and _number(ran[p].get(f))]
                    per_repeat.append(_ratio(ran.get(mine, {}).get(f), min(best)) if best else None)
                figs[f] = _median(per_repeat)
            per[f"best {group}"] = figs
        if any(v is not None for figs in per.values() for v in figs.values()):
            out[mine] = per
    return out


def ties(
    repeats: Sequence[Rows], medians: Rows, ours: Sequence[str], peers: Sequence[str]
) -> list[dict[str, Any]]:
    """Each (ours, peer, figure) whose spread across repeats exceeds the gap between the two
    medians: reported as a tie (`tie`: True) or a lead (`tie`: False)."""
    out: list[dict[str, Any]] = []
    for mine in ours:
        for peer in peers:
            a, b = medians.get(mine, {}), medians.get(peer, {})
            for f in RATIO_FIGURES:
                if not (_number(a.get(f)) and _number(b.get(f))):
                    continue
                gap = abs(float(a[f]) - float(b[f]))
                spreads = [s for n in (mine, peer) if (s := spread(repeats, n, f)) is not None]
                widest = max(spreads) if spreads else 0.0
                out.append(
                    {
                        "ours": mine, "peer": peer, "figure": f, "gap": round(gap, 4),
                        "spread": round(widest, 4), "tie": widest > gap,
                        "ahead": None if widest > gap else float(a[f]) < float(b[f]),
                    }
                )  # fmt: skip
    return out


def load_flags(
    repeats: Sequence[Rows], margin: float = DEFAULT_LOAD_MARGIN
) -> list[dict[str, Any]]:
    """Every run with its machine load; `flagged` when it is more than `margin` (a share)
    off the median load of all the other runs (all gateways, all repeats)."""
    runs = [
        (i, name, float(row[LOAD_FIGURE]))
        for i, rows in enumerate(repeats)
        for name, row in _ran(rows).items()
        if _number(row.get(LOAD_FIGURE))
    ]
    out: list[dict[str, Any]] = []
    for j, (i, name, load) in enumerate(runs):
        others = [x for k, (_, _, x) in enumerate(runs) if k != j]
        ref = statistics.median(others) if others else None
        off = (load - ref) / ref if ref else None
        out.append(
            {
                "repeat": i, "gateway": name, "load": round(load, 2),
                "others_median": None if ref is None else round(ref, 2),
                "off_share": None if off is None else round(off, 3),
                "flagged": off is not None and abs(off) > margin,
            }
        )  # fmt: skip
    return out


def target_check(
    ratios: Mapping[str, Mapping[str, Mapping[str, float | None]]],
) -> list[dict[str, Any]]:
    """The issue's targets against the median ratios to each group's best peer."""
    out: list[dict[str, Any]] = []
    for mine, per in ratios.items():
        for (group, f), bound in TARGETS.items():
            value = per.get(f"best {group}", {}).get(f)
            if value is None:
                continue
            out.append(
                {"ours": mine, "group": group, "figure": f, "ratio": value,
                 "target": bound, "met": value <= bound}
            )  # fmt: skip
    return out


def summarize_repeats(
    repeats: Sequence[Rows],
    orders: Sequence[Sequence[str]],
    ours: Sequence[str],
    margin: float = DEFAULT_LOAD_MARGIN,
) -> dict[str, Any]:
    """Everything above, as results.json's `repeated` section."""
    medians = median_rows(repeats)
    names = list(medians)
    pg = groups(names, ours)
    mine = [n for n in names if n in ours]
    ratios = peer_ratios(repeats, mine, pg)
    return {
        "repeats": len(repeats),
        "orders": [list(o) for o in orders],
        "peer_groups": pg,
        "load_margin": margin,
        "load": load_flags(repeats, margin),
        "ratios": ratios,
        "ties": ties(repeats, medians, mine, [p for g in pg.values() for p in g]),
        "targets": target_check(ratios),
    }


def merge_results(parts: Sequence[Mapping[str, Any]]) -> tuple[list[Rows], list[list[str]]]:
    """Rows and gateway orders of separate results (each `repeat_rows` when it has them,
    else its `gateways`), in the order given."""
    rows: list[Rows] = []
    orders: list[list[str]] = []
    for part in parts:
        reps = part.get("repeat_rows") or [part["gateways"]]
        part_orders = (part.get("repeated") or {}).get("orders") or [list(r) for r in reps]
        rows += reps
        orders += [list(o) for o in part_orders]
    return rows, orders


def join_partial(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One repeat from one-repeat runs that each ran part of it (a run cut short, then the
    gateways it missed): the rows of all, a later run's filling what an earlier one lacks or
    skipped; the order is the order they ran in."""
    if len(parts) == 1:
        return dict(parts[0])
    rows: dict[str, Any] = {}
    for part in parts:
        reps = part.get("repeat_rows") or [part["gateways"]]
        if len(reps) != 1:
            raise ValueError("only one-repeat runs join into one repeat")
        for name, row in reps[0].items():
            if name not in rows or rows[name].get("skipped"):
                rows[name] = row
    joined = dict(parts[0])
    joined["gateways"] = rows
    joined["repeat_rows"] = [rows]
    joined["repeated"] = {"orders": [list(rows)]}
    joined["notes"] = [n for p in parts for n in p.get("notes", [])]
    return joined


def _f(v: Any) -> str:
    return "–" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


FIGURE_LABELS = {"ttft_p50_s": "p50", "ttft_p90_s": "p90", "ttft_p99_s": "p99"}


def _groups_text(peer_groups: Mapping[str, Sequence[str]]) -> str:
    return "; ".join(f"{g}: {', '.join(m) or 'none'}" for g, m in peer_groups.items())


def repeats_markdown(rep: Mapping[str, Any]) -> str:
    """The ratios, ties, loads and targets of a repeated comparison, as Markdown."""
    lines = [
        f"Median over {rep['repeats']} repeats of ours / peer (each repeat its own ratio; "
        "`best <group>`: the lowest peer of that group in the same repeat). "
        f"Groups: {_groups_text(rep['peer_groups'])}.",
        "",
        "| ours | against | p50 | p90 | p99 |",
        "|---|---|---:|---:|---:|",
    ]
    for mine, per in rep.get("ratios", {}).items():
        for peer, figs in per.items():
            lines.append(
                f"| {mine} | {peer} | " + " | ".join(_f(figs.get(f)) for f in RATIO_FIGURES) + " |"
            )
    lines += [
        "",
        "Ties: a figure whose spread across repeats (max - min, the wider of the two gateways) "
        "is larger than the gap between their medians.",
        "",
        "| ours | peer | figure | gap s | spread s | verdict |",
        "|---|---|---|---:|---:|---|",
    ]
    for t in rep.get("ties", []):
        verdict = "tie" if t["tie"] else ("ours ahead" if t["ahead"] else "peer ahead")
        lines.append(
            f"| {t['ours']} | {t['peer']} | {FIGURE_LABELS[t['figure']]} | {_f(t['gap'])} | "
            f"{_f(t['spread'])} | {verdict} |"
        )
    margin = rep.get("load_margin", DEFAULT_LOAD_MARGIN)
    lines += [
        "",
        f"Machine load per run (1-minute load average, mean over the replay); flagged when more "
        f"than {100 * margin:.0f}% off the median of all the other runs.",
        "",
        "| repeat | gateway | load | others' median | off | flag |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for x in rep.get("load", []):
        off = "–" if x["off_share"] is None else f"{100 * x['off_share']:+.0f}%"
        lines.append(
            f"| {x['repeat'] + 1} | {x['gateway']} | {_f(x['load'])} | "
            f"{_f(x['others_median'])} | {off} | {'**flagged**' if x['flagged'] else ''} |"
        )
    if rep.get("targets"):
        lines += [
            "",
            "Targets (issue 24): median ratio to the best peer.",
            "",
            "| ours | peers | figure | ratio | target | met |",
            "|---|---|---|---:|---:|---|",
        ]
        for t in rep["targets"]:
            lines.append(
                f"| {t['ours']} | {t['group']} | {FIGURE_LABELS[t['figure']]} | "
                f"{_f(t['ratio'])} | ≤ {t['target']:g} | {'yes' if t['met'] else '**no**'} |"
            )
    return "\n".join(lines)
