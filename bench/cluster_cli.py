"""`warmgate bench cluster`: replay a trace through the discrete-event cluster simulator once
per routing policy and compare them. The trace is Mooncake-format JSONL, or an Azure LLM
inference CSV (`.csv`: real arrivals and lengths, no prefix identity, so every request gets
blocks of its own and the comparison is of load balancing alone).

Writes JSON (per policy: `token_hit_rate`, `hit_rate_by_tier` {hbm, host, array},
`ttft_p50_s` / `ttft_p90_s` / `ttft_p99_s`, `tpot_p50_s` / `tpot_p90_s` / `tpot_p99_s` (time
per output token after the first), `load_imbalance` (max / mean requests per
instance), `requests`, utilisation and concurrency per instance; plus
`upper_bound_token_hit_rate`, one infinite cache: the workload's reusable maximum, and per
policy `share_of_reusable`, its token hit rate as a fraction of it) and prints a Markdown
table. Policies run one after another, or in `--jobs` worker processes.

`--seeds 7-15` runs the comparison once per seed (`bench.cluster_seeds`: `--trace game`
generates each seed's game trace, a `--trace` with `{seed}` in it names files) and reports
per seed and the median and range of each policy's TTFT ratios to `--baseline`.

Every instance is measured by the gateway's join probe before the trace starts
(`--probe`, the default, as `calibration.probe` is in the gateway; `sim.cluster.probe`), so
`ttft` starts from its generic prior plus the probe; `--no-probe` is the prior alone.

What a game server tells the gateway (issue 22; all off by default, so every figure before
is unchanged): `--warm-lead-s S` (game traces warm each dialogue's first line S ahead, and
the simulated gateway warms), `--bumps T1,T2` (every zone's world state changes at those
seconds), `--barks R` (ambient barks, R a second), `--priority-classes` (dialogue lines
interactive, barks background; the instances order their queues by class and admission sheds
background first), `--replication` (the gateway's world-version detection warms a new
version on the zone's other instances), `--announce-versions` (a tagged new version is warmed
everywhere at once). With any, each policy's figures gain `hints` (sim.cluster.hint_metrics).
`--hints-ab` measures each hint with against without, in the same run (bench.cluster_hints).
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

from bench.cluster_hint_args import (
    add_hint_flags,
    hint_config,
    hint_run,
    hints_ab,
    parse_bumps,
    parse_hint_figures,
)
from bench.cluster_hints import hints_markdown
from bench.cluster_seeds import (
    HintRun,
    distinct_block_tokens,
    markdown,
    parse_seeds,
    parse_share,
    run_seeds,
)
from sim.cluster.metrics import distinct_tokens, ttft_floor, upper_bound_token_hit_rate
from sim.cluster.reuse import share_of_reusable
from sim.cluster.runner import Prior, run_policy
from sim.cluster.simulator import ClusterConfig
from sim.profiles import DEFAULT_PROFILE, get_profile
from sim.traces import TraceRequest, check_block_counts, load_trace

DEFAULT_POLICIES = "round_robin,least_load,session,prefix,ttft"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="warmgate bench cluster", description=__doc__)
    p.add_argument(
        "--trace",
        required=True,
        help="Mooncake-format JSONL trace, or an Azure CSV (.csv); with --seeds: `game` "
        "(the game workload of each seed) or a path with {seed} in it",
    )
    p.add_argument("--seeds", default=None, help="run every seed: 7-15, 1,3,5 or 1-3,20-22")
    p.add_argument("--players", type=int, default=120, help="--trace game: players")
    p.add_argument("--minutes", type=float, default=10.0, help="--trace game: minutes")
    p.add_argument(
        "--l1-share",
        default=None,
        help="HBM KV per instance as a share of the trace's distinct blocks x block tokens "
        "(e.g. 1/12), instead of --l1-tokens",
    )
    p.add_argument("--baseline", default="prefix", help="--seeds: ratios are to this policy")
    p.add_argument(
        "--probe",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure every instance with the gateway's join probe before the trace",
    )
    p.add_argument(
        "--params",
        action="append",
        default=[],
        metavar="POLICY=JSON",
        help="constructor parameters of one policy, e.g. ttft='{\"trust_error\": 0.2}'",
    )
    p.add_argument("--md", dest="md_out", default=None, help="write the Markdown here")
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
    add_hint_flags(p)
    return p


def _one(
    trace_path: str,
    limit: int | None,
    config: ClusterConfig,
    policy: str,
    prior: Prior,
    probe: bool,
    params: dict[str, Any] | None,
    hinted: HintRun | None = None,
) -> dict[str, Any]:
    trace = load_trace(trace_path, block_tokens=config.block_tokens, limit=limit)
    return _simulate(trace, config, policy, prior, probe, params, hinted)


def _simulate(
    trace: Sequence[TraceRequest],
    config: ClusterConfig,
    policy: str,
    prior: Prior,
    probe: bool,
    params: dict[str, Any] | None,
    hinted: HintRun | None,
) -> dict[str, Any]:
    h = hinted or HintRun()
    return run_policy(
        trace,
        config,
        policy,
        params,
        prior=prior,
        probe=probe,
        hints=h.hints,
        bumps_s=h.bumps_s,
        bump_window_s=h.bump_window_s,
    )


def policy_params(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`--params POLICY=JSON` items as {policy: params}."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        name, sep, text = item.partition("=")
        value = json.loads(text) if sep else None
        if not isinstance(value, dict):
            raise SystemExit(f"--params {item!r}: want POLICY=a JSON object")
        out.setdefault(name.strip(), {}).update(value)
    return out


def markdown_table(results: dict[str, Any]) -> str:
    head = (
        "| policy | requests | token hit | of max | HBM | host | array | TTFT p50 s | p90 s "
        "| p99 s | TPOT p50 ms | p99 ms | imbalance | busy | prefill share | conc./inst. |"
    )
    lines = [head, "|" + "---|" * 16]
    for name, r in results["policies"].items():
        t = r["hit_rate_by_tier"]
        lines.append(
            f"| {name} | {r['requests']} | {r['token_hit_rate']:.3f} "
            f"| {r['share_of_reusable'] or 0.0:.2f} | {t['hbm']:.3f} "
            f"| {t['host']:.3f} | {t['array']:.3f} | {r['ttft_p50_s']:.3f} "
            f"| {r['ttft_p90_s']:.3f} | {r['ttft_p99_s']:.3f} "
            f"| {1000 * r['tpot_p50_s']:.1f} | {1000 * r['tpot_p99_s']:.1f} "
            f"| {r['load_imbalance']:.2f} "
            f"| {r['utilisation_mean']:.2f} | {r['prefill_share_mean']:.2f} "
            f"| {r['concurrency_mean_per_instance']:.1f} |"
        )
    floor = results["ttft_floor"]
    lines.append(
        f"\nreusable maximum (token hit rate of one infinite cache): "
        f"{results['upper_bound_token_hit_rate']:.3f}; TTFT floor (each request alone on an "
        f"idle instance holding every block computed before it; no policy is below it): "
        f"p50 {floor['ttft_p50_s']:.3f} / p90 {floor['ttft_p90_s']:.3f} / "
        f"p99 {floor['ttft_p99_s']:.3f} s"
    )
    return "\n".join(lines)


def cluster_config(args: argparse.Namespace) -> ClusterConfig:
    """The simulated fleet the flags describe (one run and `--seeds` alike)."""
    return ClusterConfig(
        instances=args.instances,
        block_tokens=args.block_tokens,
        l1_tokens=args.l1_tokens,
        l2_tokens=args.l2_tokens,
        array_tokens=args.array_tokens,
        profile=args.profile,
        rate_scale=args.rate_scale,
        array_write_through=args.array_write_through,
    )


def policy_names(args: argparse.Namespace) -> list[str]:
    return [p.strip() for p in args.policies.split(",") if p.strip()]


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    get_profile(args.profile)  # fail early on a bad name
    trace: list[TraceRequest] = load_trace(
        args.trace, block_tokens=args.block_tokens, limit=args.limit
    )
    if not trace:
        raise SystemExit(f"{args.trace}: no requests")
    mismatched = check_block_counts(trace, args.block_tokens)
    if args.l1_share is not None:
        args.l1_tokens = max(
            args.block_tokens,
            round(distinct_block_tokens(trace, args.block_tokens) * parse_share(args.l1_share)),
        )
    if mismatched:
        print(
            f"warning: {mismatched} requests have len(hash_ids) != "
            f"ceil(input_length / {args.block_tokens}); is --block-tokens right?",
            file=sys.stderr,
        )
    config = cluster_config(args)
    policies = policy_names(args)
    params = policy_params(args.params)
    hinted = hint_run(args)
    per_policy: dict[str, dict[str, Any]] = {}
    if args.jobs > 1 and len(policies) > 1:
        with ProcessPoolExecutor(max_workers=min(args.jobs, len(policies))) as pool:
            futures = {
                p: pool.submit(
                    _one,
                    args.trace,
                    args.limit,
                    config,
                    p,
                    args.prior,
                    args.probe,
                    params.get(p),
                    hinted,
                )
                for p in policies
            }
            per_policy = {p: f.result() for p, f in futures.items()}
    else:
        for p in policies:
            per_policy[p] = _simulate(
                trace, config, p, args.prior, args.probe, params.get(p), hinted
            )
    reusable = upper_bound_token_hit_rate(trace, args.block_tokens)
    for figures in per_policy.values():
        figures["share_of_reusable"] = share_of_reusable(figures["token_hit_rate"], reusable)
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
            "probe": args.probe,
            "policy_params": params,
            "index_feed": "predict-on-route + residency events (HBM/host/array stored/removed)",
            **hint_config(hinted),
        },
        "trace_requests": len(trace),
        "trace_span_s": span_ms / 1000.0 / args.rate_scale,
        "arrival_rate_per_s": len(trace) / max(1e-9, span_ms / 1000.0 / args.rate_scale),
        "distinct_tokens": distinct_tokens(trace, args.block_tokens),
        "upper_bound_token_hit_rate": reusable,
        "ttft_floor": ttft_floor(trace, args.block_tokens, get_profile(args.profile)),
        "policies": per_policy,
        "wall_s": time.perf_counter() - started,
    }


def run_many(args: argparse.Namespace) -> dict[str, Any]:
    """`--seeds`: every seed under every policy (bench.cluster_seeds)."""
    started = time.perf_counter()
    get_profile(args.profile)
    policies = policy_names(args)
    base = cluster_config(args)
    params = policy_params(args.params)
    results = run_seeds(
        trace=args.trace,
        seeds=parse_seeds(args.seeds),
        policies=policies,
        base=base,
        l1_share=parse_share(args.l1_share) if args.l1_share is not None else None,
        players=args.players,
        minutes=args.minutes,
        baseline=args.baseline,
        prior=args.prior,
        probe=args.probe,
        params=params,
        jobs=max(1, args.jobs),
        hinted=hint_run(args),
    )
    results["config"] = {
        "trace": args.trace,
        "instances": args.instances,
        "block_tokens": args.block_tokens,
        "l1_tokens": None if args.l1_share is not None else args.l1_tokens,
        "l1_share": args.l1_share,
        "l2_tokens": args.l2_tokens,
        "array_tokens": args.array_tokens,
        "profile": args.profile,
        "rate_scale": args.rate_scale,
        "array_write_through": args.array_write_through,
        "ttft_prior": args.prior,
        "probe": args.probe,
        "policy_params": params,
        "players": args.players if args.trace == "game" else None,
        "minutes": args.minutes if args.trace == "game" else None,
        **hint_config(hint_run(args)),
    }
    results["wall_s"] = time.perf_counter() - started
    return results


def _write(args: argparse.Namespace, results: dict[str, Any], table: str) -> None:
    print(table)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(results, indent=2) + "\n")
    if args.md_out:
        Path(args.md_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md_out).write_text(table + "\n")


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    if args.instances <= 0 or args.block_tokens <= 0 or args.l1_tokens < args.block_tokens:
        print(
            "instances, block tokens and l1 tokens (>= one block) must be positive", file=sys.stderr
        )
        return 2
    try:
        if args.l1_share is not None:
            parse_share(args.l1_share)
        if args.seeds is not None:
            parse_seeds(args.seeds)
        parse_bumps(args.bumps)
        parse_hint_figures(args.hint_figures)
    except ValueError as exc:
        print(f"warmgate bench cluster: {exc}", file=sys.stderr)
        return 2
    if args.hints_ab:
        if args.seeds is None or args.trace != "game":
            print("--hints-ab wants --seeds and --trace game", file=sys.stderr)
            return 2
        results = hints_ab(
            args, cluster_config(args), policy_names(args), policy_params(args.params)
        )
        _write(args, results, hints_markdown(results))
        return 0
    if args.seeds is not None:
        if args.trace != "game" and "{seed}" not in args.trace:
            print("--seeds wants --trace game or a path with {seed} in it", file=sys.stderr)
            return 2
        results = run_many(args)
        _write(args, results, markdown(results))
        return 0
    if not Path(args.trace).is_file():
        print(f"{args.trace}: no such file", file=sys.stderr)
        return 2
    results = run(args)
    _write(args, results, markdown_table(results))
    return 0
