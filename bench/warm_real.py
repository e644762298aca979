"""Warm on vs off on real vLLM engines (issue 22, item 1's measurement): `bench.warm_ab`'s
schedule against two fresh vLLM engines (`bench.real_fleet`, the tiny local model, one core
each) behind one warmgate gateway (`warmgate-ttft`, precise mode), in rounds whose order is
rotated: warms on, off, off, on by default. Every round salts its NPC prompts, so no round
finds another's blocks cached; the schedule (arrival times, prompt words) is the same seed in
every round. Within a warms-on round the even dialogues are warmed and the odd are not (the
same run's cold arm); a warms-off round is the baseline of both.

    python -m bench.warm_real --dialogues 30 --rate 0.5 --prompt-words 600 \\
        --out bench/results/2026-12-02-warm-vllm

writes `results.json` (every round's `bench.warm_ab` summary) and `report.md` (one table).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from bench.real_fleet import (
    VLLM_BODY_EXTRA,
    RealFleetSpec,
    add_step_option,
    real_fleet_with_gateway,
    step_engine_args,
)
from bench.warm_ab import Target, run

GATEWAY = "warmgate-ttft"


async def rounds(args: argparse.Namespace) -> dict[str, Any]:
    spec = RealFleetSpec(
        instances=args.instances,
        kv_cache_gib=args.kv_cache_gib,
        engine_args=step_engine_args(args),
    )
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "rounds": []}
    async with real_fleet_with_gateway(spec, GATEWAY, args.out / "logs") as (fleet, gw):
        assert gw is not None and fleet.block_size is not None
        base = gw.base_url.removesuffix("/v1")
        out["block_size"] = fleet.block_size
        for n, arm in enumerate(args.order.split(",")):
            round_args = argparse.Namespace(**vars(args))
            round_args.no_warms = arm == "off"
            target = Target(fleet.model, fleet.block_size, dict(VLLM_BODY_EXTRA), f"r{n} ")
            result = await run(round_args, base, target)
            result["round"], result["warms_on"] = n, arm == "on"
            result["args"] = {k: str(v) for k, v in vars(round_args).items()}
            out["rounds"].append(result)
            print(json.dumps(_row(result)), file=sys.stderr, flush=True)
    return out


def _row(result: dict[str, Any]) -> dict[str, Any]:
    ft = result["first_line_ttft"]
    return {
        "round": result["round"],
        "warms": "on" if result["warms_on"] else "off",
        "even_n": ft["warm"]["n"],
        "even_p50": ft["warm"]["p50_s"],
        "even_p99": ft["warm"]["p99_s"],
        "odd_n": ft["cold"]["n"],
        "odd_p50": ft["cold"]["p50_s"],
        "odd_p99": ft["cold"]["p99_s"],
        "warms_ok": result["warms"]["ok_by_source"],
        "warms_refused": result["warms"]["refused"],
        "cached_over_full": result["warmed_first_line_cached_over_full_blocks"]["mean"],
        "failed": result["failed"],
    }


def report(out: dict[str, Any]) -> str:
    lines = [
        "# Warm on vs off, real vLLM (bench.warm_real)",
        "",
        f"block size {out.get('block_size')}; args {out['args']}",
        "",
        "| round | warms | even (warmed when on) n | p50 s | p99 s | odd (never warmed) n "
        "| p50 s | p99 s | warms ok | refused | cached / warmed full blocks |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in out["rounds"]:
        row = _row(r)
        ratio = row["cached_over_full"]
        lines.append(
            f"| {row['round']} | {row['warms']} | {row['even_n']} | {_s(row['even_p50'])} "
            f"| {_s(row['even_p99'])} | {row['odd_n']} | {_s(row['odd_p50'])} "
            f"| {_s(row['odd_p99'])} | {row['warms_ok']} | {row['warms_refused']} "
            f"| {'' if ratio is None else f'{ratio:.3f}'} |"
        )
    return "\n".join(lines) + "\n"


def _s(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.warm_real", description=__doc__)
    p.add_argument("--dialogues", type=int, default=30, help="dialogues per round")
    p.add_argument("--rate", type=float, default=0.5, help="dialogue starts per second")
    p.add_argument("--lead-s", type=float, default=3.0, help="warm this long before the line")
    p.add_argument("--prompt-words", type=int, default=600, help="NPC prompt length")
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--order", default="on,off,off,on", help="rounds, warms on or off")
    add_step_option(p)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if any(a not in ("on", "off") for a in args.order.split(",")):
        p.error("--order takes a comma-separated list of on and off")
    args.out.mkdir(parents=True, exist_ok=True)
    out = asyncio.run(rounds(args))
    (args.out / "results.json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    (args.out / "report.md").write_text(report(out))
    print(report(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
