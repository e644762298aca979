"""Issue 24's cluster cases in one command, and one comparison of two labels over them.

The cases are the ones every `ttft` change has been judged on since 2026-12-02
(docs/BENCHMARKS.md, "Cluster simulator: the join probe, many seeds" and after): game
traffic on 4 instances with L1 = distinct blocks / 12, 64-token blocks, the generic prior
plus the join probe, `prefix` as the baseline, and the Mooncake conversation trace on 8.

    python -m bench.cluster_cases run --label after --out DIR [--cases g,h] \\
        [--params 'ttft={"saturated_budget": "hard"}']
    python -m bench.cluster_cases compare --out DIR before after

`run` writes DIR/<case>-<label>.json and .md (`warmgate bench cluster`'s own files);
`compare` prints, per label and case set, the geometric means of ttft / prefix at p50, p90
and p99, how many cases are over issue 24's per-case targets (p50 > 1.0, p99 > 0.8) and
over prefix at p99, and the worst; then the group medians. The simulator is deterministic,
so a label run twice on one commit gives the same files.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from bench import cluster_cli

GAME = ("--trace", "game", "--block-tokens", "64", "--instances", "4", "--l1-share", "1/12")
MOONCAKE = (
    "--trace",
    "bench/data/traces/mooncake_conversation.jsonl",
    "--block-tokens",
    "512",
    "--instances",
    "8",
    "--l1-tokens",
    "2000000",
)


@dataclass(frozen=True)
class Case:
    """One `warmgate bench cluster` invocation and the set its ratios are counted in."""

    name: str
    group: str
    args: tuple[str, ...]

    @property
    def seeded(self) -> bool:
        return "--seeds" in self.args


def _game(name: str, group: str, seeds: str, *more: str) -> Case:
    return Case(name, group, (*GAME, "--seeds", seeds, *more))


CASES: tuple[Case, ...] = (
    _game("g", "35 cases", "7-15"),
    _game("h", "35 cases", "20-28"),
    _game("o", "35 cases", "7-15", "--players", "150"),
    _game("r", "35 cases", "7-9", "--rate-scale", "2"),
    _game("p", "35 cases", "7-9", "--profile", "llama3-8b-h100"),
    Case("m", "35 cases", MOONCAKE),
    Case("m2", "35 cases", (*MOONCAKE, "--rate-scale", "2")),
    _game("g-s40-51", "seeds 40-51", "40-51"),
    _game("o-s40-51", "seeds 40-51", "40-51", "--players", "150"),
    _game("p-s40-51", "seeds 40-51", "40-51", "--profile", "llama3-8b-h100"),
    _game("g-s60-68", "seeds 60-68", "60-68"),
    _game("o-s60-68", "seeds 60-68", "60-68", "--players", "150"),
    _game("p-s60-68", "seeds 60-68", "60-68", "--profile", "llama3-8b-h100"),
)
BY_NAME = {c.name: c for c in CASES}


def pick(names: str | None) -> list[Case]:
    if not names:
        return list(CASES)
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown cases {unknown}; known: {', '.join(BY_NAME)}")
    return [BY_NAME[n] for n in chosen]


def run(cases: Sequence[Case], label: str, out: Path, params: Sequence[str], jobs: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for case in cases:
        stem = out / f"{case.name}-{label}"
        argv = [*case.args, "--policies", "prefix,ttft", "--jobs", str(jobs)]
        argv += [f"--params={p}" for p in params]
        argv += ["--json", f"{stem}.json", "--md", f"{stem}.md"]
        print(f"[cases] {case.name} ({label})", file=sys.stderr, flush=True)
        code = cluster_cli.main(argv)
        if code != 0:
            return code
    return 0


class Ratio(NamedTuple):
    """ttft / prefix at one seed of one case."""

    seed: str
    p50: float
    p90: float
    p99: float
    floor_p99: float | None = None  # the TTFT floor / prefix at p99: the best any policy could do


def ratios(result: dict[str, Any]) -> list[Ratio]:
    """ttft / prefix for every seed of one file ("-" for a trace run once)."""
    if "per_seed" in result:
        runs = {
            seed: (r["policies"], r.get("ttft_floor")) for seed, r in result["per_seed"].items()
        }
    else:
        runs = {"-": (result["policies"], result.get("ttft_floor"))}
    rows = []
    for seed, (pols, floor) in runs.items():
        t, p = pols["ttft"], pols["prefix"]
        rows.append(
            Ratio(
                seed,
                t["ttft_p50_s"] / p["ttft_p50_s"],
                t["ttft_p90_s"] / p["ttft_p90_s"],
                t["ttft_p99_s"] / p["ttft_p99_s"],
                floor["ttft_p99_s"] / p["ttft_p99_s"] if floor else None,
            )
        )
    return rows


def _geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summary(rows: Sequence[Ratio]) -> dict[str, float | int]:
    p50 = [r.p50 for r in rows]
    p90 = [r.p90 for r in rows]
    p99 = [r.p99 for r in rows]
    return {
        "cases": len(rows),
        "p50_geomean": _geomean(p50),
        "p90_geomean": _geomean(p90),
        "p99_geomean": _geomean(p99),
        "p50_over_1": sum(x > 1.0 for x in p50),
        "p99_over_0.8": sum(x > 0.8 for x in p99),
        "p99_over_1": sum(x > 1.0 for x in p99),
        "worst_p50": max(p50),
        "worst_p99": max(p99),
        # cases where no policy could reach 0.8x prefix at p99 (files before the floor: 0)
        "floor_p99_over_0.8": sum(r.floor_p99 is not None and r.floor_p99 > 0.8 for r in rows),
    }


def load(out: Path, case: Case, label: str) -> dict[str, Any] | None:
    path = out / f"{case.name}-{label}.json"
    if not path.exists():
        return None
    result: dict[str, Any] = json.loads(path.read_text())
    return result


def compare(out: Path, labels: Sequence[str], cases: Sequence[Case] = CASES) -> str:
    lines = [
        "| cases | label | p50 / p90 / p99 geomean | p50 > 1.0 | p99 > 0.8 | p99 > 1.0 "
        "| worst p50 | worst p99 | floor p99 > 0.8 |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    groups: dict[str, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.group, []).append(case)
    per_case: list[str] = []
    for group, cases in groups.items():
        for label in labels:
            rows: list[Ratio] = []
            for case in cases:
                result = load(out, case, label)
                if result is not None:
                    rows += ratios(result)
            if not rows:
                continue
            s = summary(rows)
            lines.append(
                f"| {group} ({s['cases']}) | {label} | {s['p50_geomean']:.3f} / "
                f"{s['p90_geomean']:.3f} / {s['p99_geomean']:.3f} | {s['p50_over_1']} "
                f"| {s['p99_over_0.8']} | {s['p99_over_1']} | {s['worst_p50']:.2f} "
                f"| {s['worst_p99']:.2f} | {s['floor_p99_over_0.8']} |"
            )
        for case in cases:
            cells = []
            for label in labels:
                result = load(out, case, label)
                if result is None:
                    continue
                rows = ratios(result)
                p50 = statistics.median(r.p50 for r in rows)
                p90 = statistics.median(r.p90 for r in rows)
                p99 = statistics.median(r.p99 for r in rows)
                worst = max(r.p99 for r in rows)
                floors = [r.floor_p99 for r in rows if r.floor_p99 is not None]
                floor = f"; floor {statistics.median(floors):.2f}" if floors else ""
                cells.append(f"{p50:.2f} / {p90:.2f} / {p99:.2f} ({worst:.2f}{floor})")
            if cells:
                per_case.append(f"| {case.name} | " + " | ".join(cells) + " |")
    heads = (f"{label}: median p50 / p90 / p99 (worst p99; floor p99)" for label in labels)
    head = "| case | " + " | ".join(heads)
    return "\n".join([*lines, "", head + " |", "|---|" + "---|" * len(labels), *per_case])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster_cases", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the cases under one label")
    r.add_argument("--label", required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--cases", default=None, help=f"comma list of {', '.join(BY_NAME)}")
    r.add_argument("--params", action="append", default=[], metavar="POLICY=JSON")
    r.add_argument("--jobs", type=int, default=2)
    c = sub.add_parser("compare", help="compare labels already run")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("labels", nargs="+")
    args = p.parse_args(argv)
    if args.cmd == "run":
        try:
            cases = pick(args.cases)
        except ValueError as exc:
            p.error(str(exc))
        if "-" in args.label or "/" in args.label:
            p.error("--label may not contain '-' or '/' (it ends a file name)")
        return run(cases, args.label, args.out, args.params, args.jobs)
    print(compare(args.out, args.labels))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
