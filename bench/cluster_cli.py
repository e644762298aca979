"""`warmgate bench cluster`: replay a trace through the discrete-event cluster simulator once
per routing policy and compare them. The trace is Mooncake-format JSONL, or an Azure LLM
inference CSV (`.csv`: real arrivals and lengths, no prefix identity, so every request gets
blocks of its own and the comparison is of load balancing alone).

Writes JSON (per policy: `token_hit_rate`, `hit_rate_by_tier` {hbm, host, array},
`ttft_p50_s` / `ttft_p90_s` / `ttft_p99_s`, `tpot_p50_s` / `tpot_p90_s` / `tpot_p99_s` (time
per output token after the first), `load_imbalance` (max / mean requests per
instance), `requests`, utilisation and concurrency per instance; plus
`upper_bound_token_hit_rate`, one infinite cache) and prints a Markdown table.
Policies run one after another, or in `--jobs` worker processes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from sim.cluster.metrics import distinct_tokens, upper_bound_token_hit_rate
from sim.cluster.runner import Prior, run_policy
from sim.cluster.simulator import ClusterConfig
from sim.profiles import DEFAULT_PROFILE, get_profile
from sim.traces import TraceRequest, check_block_counts, load_trace

DEFAULT_POLICIES = "round_robin,least_load,session,prefix,ttft"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="warmgate bench cluster", description=__doc__)
    p.add_argument(
        "--trace", required=True, help="Mooncake-format JSONL trace, or an Azure CSV (.csv)"
    )
    p.add_argument("--block-tokens", type=int, default=512, help="tokens per hash id")
    p.add_argument("--instances", type=int, default=8)
    p.add_argument("--l1-tokens", type=int, default=2_000_000, help="HBM KV per instance")
    p.add_argument("--l2-tokens", type=int, default=0, help="L2 per instance (0: none)")
    p.add_argument("--array-tokens", type=int, default=0, help="shared array (0: none)")
    p.add_argument(
        "--array-write-through",
        action="store_true",
        help="write computed KV to the array at once (else only on eviction from L1/L2)",
    )
    p.add_argument("--profile", default=DEFAULT_PROFILE, help="timing profile (sim.profiles)")
    p.add_argument("--rate-scale", type=float, default=1.0, help=">1 compresses arrivals")
    p.add_argument("--policies", default=DEFAULT_POLICIES, help="comma-separated")
    p.add_argument("--limit", type=int, default=None, help="only the first N requests")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (policies in parallel)")
    p.add_argument(
        "--prior",
        choices=("generic", "oracle"),
        default="generic",
        help="where ttft's cost model starts: its generic prior (as deployed), or the "
        "simulated profile itself (oracle)",
    )
    p.add_argument("--json", dest="json_out", default=None, help="write results here")
    return p


def _one(
    trace_path: str, limit: int | None, config: ClusterConfig, policy: str, prior: Prior
) -> dict[str, Any]:
    trace = load_trace(trace_path, block_tokens=config.block_tokens, limit=limit)
    return run_policy(trace, config, policy, prior=prior)


def markdown_table(results: dict[str, Any]) -> str:
    head = (
        "| policy | requests | token hit | HBM | host | array | TTFT p50 s | p90 s | p99 s "
        "| TPOT p50 ms | p99 ms | imbalance | busy | prefill share | conc./inst. |"
    )
    lines = [head, "|" + "---|" * 15]
    for name, r in results["policies"].items():
        t = r["hit_rate_by_tier"]
        lines.append(
            f"| {name} | {r['requests']} | {r['token_hit_rate']:.3f} | {t['hbm']:.3f} "
            f"| {t['host']:.3f} | {t['array']:.3f} | {r['ttft_p50_s']:.3f} "
            f"| {r['ttft_p90_s']:.3f} | {r['ttft_p99_s']:.3f} "
            f"| {1000 * r['tpot_p50_s']:.1f} | {1000 * r['tpot_p99_s']:.1f} "
            f"| {r['load_imbalance']:.2f} "
            f"| {r['utilisation_mean']:.2f} | {r['prefill_share_mean']:.2f} "
            f"| {r['concurrency_mean_per_instance']:.1f} |"
        )
    lines.append(
        f"\nupper bound token hit rate (one infinite cache): "
        f"{results['upper_bound_token_hit_rate']:.3f}"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    get_profile(args.profile)  # fail early on a bad name
    trace: list[TraceRequest] = load_trace(
        args.trace, block_tokens=args.block_tokens, limit=args.limit
    )
    if not trace:
        raise SystemExit(f"{args.trace}: no requests")
    mismatched = check_block_counts(trace, args.block_tokens)
    if mismatched:
        print(
            f"warning: {mismatched} requests have len(hash_ids) != "
            f"ceil(input_length / {args.block_tokens}); is --block-tokens right?",
            file=sys.stderr,
        )
    config = ClusterConfig(
        instances=args.instances,
        block_tokens=args.block_tokens,
        l1_tokens=args.l1_tokens,
        l2_tokens=args.l2_tokens,
        array_tokens=args.array_tokens,
        profile=args.profile,
        rate_scale=args.rate_scale,
        array_write_through=args.array_write_through,
    )
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    per_policy: dict[str, dict[str, Any]] = {}
    if args.jobs > 1 and len(policies) > 1:
        with ProcessPoolExecutor(max_workers=min(args.jobs, len(policies))) as pool:
            futures = {
                p: pool.submit(_one, args.trace, args.limit, config, p, args.prior)
                for p in policies
            }
            per_policy = {p: f.result() for p, f in futures.items()}
    else:
        for p in policies:
            per_policy[p] = run_policy(trace, config, p, prior=args.prior)
    span_ms = trace[-1].timestamp_ms - trace[0].timestamp_ms
    return {
        "trace": str(args.trace),
        "config": {
            "instances": args.instances,
            "block_tokens": args.block_tokens,
            "l1_tokens": args.l1_tokens,
            "l2_tokens": args.l2_tokens,
            "array_tokens": args.array_tokens,
            "profile": args.profile,
            "rate_scale": args.rate_scale,
            "array_write_through": args.array_write_through,
            "limit": args.limit,
            "ttft_prior": args.prior,
            "index_feed": "predict-on-route + residency events (HBM/host/array stored/removed)",
        },
        "trace_requests": len(trace),
        "trace_span_s": span_ms / 1000.0 / args.rate_scale,
        "arrival_rate_per_s": len(trace) / max(1e-9, span_ms / 1000.0 / args.rate_scale),
        "distinct_tokens": distinct_tokens(trace, args.block_tokens),
        "upper_bound_token_hit_rate": upper_bound_token_hit_rate(trace, args.block_tokens),
        "policies": per_policy,
        "wall_s": time.perf_counter() - started,
    }


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    if args.instances <= 0 or args.block_tokens <= 0 or args.l1_tokens < args.block_tokens:
        print(
            "instances, block tokens and l1 tokens (>= one block) must be positive", file=sys.stderr
        )
        return 2
    if not Path(args.trace).is_file():
        print(f"{args.trace}: no such file", file=sys.stderr)
        return 2
    results = run(args)
    print(markdown_table(results))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(results, indent=2) + "\n")
    return 0
