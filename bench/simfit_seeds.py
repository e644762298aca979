"""The real-vLLM overflow workload of many seeds in the cluster simulator, no engines needed:
each seed's `bench compare --engines vllm --scale cpu-overflow` workload (20 players, 1.5
minutes, tokenized as the engines tokenize it: bench.simfit_trace) on the fitted CPU-engine
profile (`sim/fitted/vllm-cpu-tiny.json`), two engines as `bench compare` starts them, with
tierd beside each (`--tiers`, the default here) or bare, under each policy asked for.

    python -m bench.simfit_seeds --seeds 97,103 --runs ttft,ttft:prior,prefix,round_robin \\
        [--bare] [--json out.json]

A run is `POLICY` or `POLICY:VARIANT`, a variant being one of VARIANTS (named settings of
that policy). Prints per seed and run TTFT p50 / p90 / p99 (simulated seconds), the token
hit rate and the requests per engine: the imbalance a real run showed (seed 103, 106 of 129
requests on one engine) is visible here in seconds of CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.cluster_seeds import parse_seeds
from bench.simfit_cases import fleet_config
from bench.simfit_trace import game_trace
from gateway.launch.models import ensure_tiny_model
from sim.cluster.runner import run_policy
from sim.profiles import get_profile

PROFILE = "vllm-cpu-tiny"
BLOCK_TOKENS = 128  # the CPU engine's block size
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "ttft": {
        "prior": {"unearned_band": "prior"},
        "fixed": {"unearned_band": "fixed"},
        "hard": {"saturated_budget": "hard", "robust_own_gain": False},
    },
}


def parse_runs(text: str) -> list[tuple[str, str, dict[str, Any]]]:
    """`ttft,ttft:prior` -> [(label, policy, params)]; unknown variants are an error."""
    runs = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        policy, _, variant = item.partition(":")
        params: dict[str, Any] = {}
        if variant:
            known = VARIANTS.get(policy, {})
            if variant not in known:
                raise ValueError(f"unknown variant {item!r}; known: {_known()}")
            params = dict(known[variant])
        runs.append((item, policy, params))
    if not runs:
        raise ValueError("no runs given")
    return runs


def _known() -> str:
    return ", ".join(f"{p}:{v}" for p, vs in VARIANTS.items() for v in vs)


def simulate(seeds: Sequence[int], runs: str, tiers: bool) -> dict[str, dict[str, Any]]:
    profile = get_profile(PROFILE)
    config = fleet_config(
        PROFILE, profile.kv_capacity_tokens, profile.kv_bytes_per_token, BLOCK_TOKENS, tiers
    )
    out: dict[str, dict[str, Any]] = {}
    for seed in seeds:
        trace = game_trace(
            players=20, minutes=1.5, seed=seed, scale="cpu-overflow",
            tokenizer_dir=ensure_tiny_model(), block_tokens=BLOCK_TOKENS,
        )  # fmt: skip
        for label, policy, params in parse_runs(runs):
            f = run_policy(trace, config, policy, params or None)
            out.setdefault(str(seed), {})[label] = {
                "p50": f["ttft_p50_s"],
                "p90": f["ttft_p90_s"],
                "p99": f["ttft_p99_s"],
                "token_hit_rate": f["token_hit_rate"],
                "requests_by_instance": f["requests_by_instance"],
            }
    return out


def markdown(results: dict[str, dict[str, Any]], tiers: bool) -> str:
    lines = [
        f"Simulated ({PROFILE}, two engines, {'tierd beside each' if tiers else 'bare'})",
        "",
        "| seed | run | TTFT p50 / p90 / p99 s | hit rate | requests per engine |",
        "|---|---|---|---:|---|",
    ]
    for seed, runs in results.items():
        for label, r in runs.items():
            lines.append(
                f"| {seed} | {label} | {r['p50']:.2f} / {r['p90']:.2f} / {r['p99']:.2f} "
                f"| {r['token_hit_rate']:.3f} | {r['requests_by_instance']} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.simfit_seeds", description=__doc__)
    p.add_argument("--seeds", required=True, help="97,103 or 100-110")
    p.add_argument("--runs", default="ttft,ttft:prior,prefix,round_robin")
    p.add_argument("--bare", action="store_true", help="engines without tierd")
    p.add_argument("--json", dest="json_out", type=Path, default=None)
    args = p.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        parse_runs(args.runs)
    except ValueError as exc:
        p.error(str(exc))
    results = simulate(seeds, args.runs, tiers=not args.bare)
    print(markdown(results, not args.bare))
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
