"""`warmgate bench cluster --seeds A-B`: the same cluster comparison over many seeds at once
(issue 24, item 4a), so a figure is a median and a spread, never one seed.

Each seed's trace is the game workload (`--trace game`: what `warmgate trace game
--players P --minutes M --seed S --block-tokens B` writes) or a file named by a template
(`--trace 'dir/g{seed}.jsonl'`). Every (seed, policy) pair is one simulation
(`sim.cluster.runner.run_policy`); pairs run in `--jobs` worker processes. Per seed it
reports each policy's figures, each policy's TTFT p50 / p90 / p99 as a ratio to the
baseline policy's (default `prefix`) in the same seed, the workload's reusable maximum
(`sim.cluster.reuse`: the share of prompt tokens some earlier request had computed) and
each policy's cached share as a fraction of it; over the seeds, the median and the range
(min-max) of every ratio and share. JSON and Markdown.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from sim.cluster.hints import HintSettings
from sim.cluster.metrics import ttft_floor
from sim.cluster.reuse import reusable_share, share_of_reusable
from sim.cluster.runner import Prior, run_policy
from sim.cluster.simulator import ClusterConfig
from sim.players.encode import to_trace
from sim.players.params import GameParams
from sim.players.workload import generate
from sim.profiles import get_profile
from sim.traces import TraceRequest, load_trace, write_mooncake

RATIOS = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s")


def parse_seeds(spec: str) -> list[int]:
    """`7-15`, `7,9,11` or a mix (`1-3,20-22`), in the order given, each seed once."""
    seeds: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        span = range(int(lo), int(hi) + 1) if sep else [int(lo)]
        if not span:
            raise ValueError(f"empty seed range {part!r}")
        seeds += [s for s in span if s not in seeds]
    if not seeds:
        raise ValueError(f"no seeds in {spec!r}")
    return seeds


def parse_share(text: str) -> float:
    """`1/12` or `0.0833`: a share of the trace's distinct tokens."""
    share = float(Fraction(text))
    if not share > 0:
        raise ValueError("the L1 share must be positive")
    return share


def distinct_block_tokens(trace: Sequence[TraceRequest], block_tokens: int) -> int:
    """Distinct blocks x block size: the trace's KV if every block were full (the L1 sizes
    in bench/results/cluster-README.md are a share of this)."""
    return len({h for t in trace for h in t.hash_ids}) * block_tokens


def game_trace(
    path: Path,
    *,
    players: int,
    minutes: float,
    seed: int,
    block_tokens: int,
    server: dict[str, Any] | None = None,
) -> None:
    """Write the game workload's trace as `warmgate trace game` does (no sidecar). `server`:
    what the game server tells the gateway, GameParams fields (warm_lead_s, bump_at_s,
    bark_rate_per_s, priority_classes); with any, world versions are tagged too."""
    params = GameParams(players=players, minutes=minutes, seed=seed, **(server or {}))
    requests = generate(params)
    write_mooncake(path, to_trace(requests, block_tokens, world_tags=bool(server)))


@dataclass(frozen=True, slots=True)
class HintRun:
    """The hints of a `--seeds` run: what the game traces carry (`server`, GameParams
    fields), what the simulated gateway acts on (`hints`), and the bumps' window."""

    server: dict[str, Any] = field(default_factory=dict)
    hints: HintSettings | None = None
    bumps_s: tuple[float, ...] = ()
    bump_window_s: float = 0.0


def _one(
    trace_path: str,
    config: ClusterConfig,
    policy: str,
    params: dict[str, Any] | None,
    prior: Prior,
    probe: bool,
    hinted: HintRun | None = None,
) -> dict[str, Any]:
    trace = load_trace(trace_path, block_tokens=config.block_tokens)
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


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run_seeds(
    *,
    trace: str,
    seeds: Sequence[int],
    policies: Sequence[str],
    base: ClusterConfig,
    l1_share: float | None,
    players: int,
    minutes: float,
    baseline: str,
    prior: Prior,
    probe: bool,
    params: dict[str, dict[str, Any]],
    jobs: int,
    hinted: HintRun | None = None,
) -> dict[str, Any]:
    """Every seed under every policy; the per-seed figures, ratios and their spread."""
    bt = base.block_tokens
    with tempfile.TemporaryDirectory(prefix="warmgate-seeds-") as tmp:
        paths: dict[int, str] = {}
        for seed in seeds:
            if trace == "game":
                out = Path(tmp) / f"game-{seed}.jsonl"
                server = hinted.server if hinted is not None else None
                game_trace(
                    out,
                    players=players,
                    minutes=minutes,
                    seed=seed,
                    block_tokens=bt,
                    server=server,
                )
                paths[seed] = str(out)
            else:
                paths[seed] = trace.format(seed=seed)
        configs: dict[int, ClusterConfig] = {}
        per_seed: dict[int, dict[str, Any]] = {}
        for seed, path in paths.items():
            t = load_trace(path, block_tokens=bt)
            if not t:
                raise SystemExit(f"{path}: no requests")
            l1 = base.l1_tokens
            if l1_share is not None:
                l1 = max(bt, round(distinct_block_tokens(t, bt) * l1_share))
            configs[seed] = ClusterConfig(**{**_fields(base), "l1_tokens": l1})
            ordered = sorted(t, key=lambda r: r.timestamp_ms)
            per_seed[seed] = {
                "trace": path
                if trace != "game"
                else f"game --players {players} "
                f"--minutes {minutes:g} --seed {seed} --block-tokens {bt}",
                "requests": len(t),
                "l1_tokens": l1,
                "reusable_max": reusable_share(((r.hash_ids, r.input_length) for r in ordered), bt),
                "ttft_floor": ttft_floor(t, bt, get_profile(base.profile)),
                "policies": {},
            }
        pairs = [(s, p) for s in seeds for p in policies]
        if jobs > 1:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = {
                    (s, p): pool.submit(
                        _one, paths[s], configs[s], p, params.get(p), prior, probe, hinted
                    )
                    for s, p in pairs
                }
                results = {k: f.result() for k, f in futures.items()}
        else:
            results = {
                (s, p): _one(paths[s], configs[s], p, params.get(p), prior, probe, hinted)
                for s, p in pairs
            }
    for (seed, policy), figures in results.items():
        row = per_seed[seed]
        figures["share_of_reusable"] = share_of_reusable(
            figures["token_hit_rate"], row["reusable_max"]
        )
        row["policies"][policy] = figures
    for row in per_seed.values():
        ref = row["policies"].get(baseline)
        floor = row["ttft_floor"]
        # the best ratio to the baseline any router could reach (sim.cluster.floor)
        row["floor_ratios"] = {
            k: (floor[k] / ref[k] if ref and ref[k] > 0 else None) for k in RATIOS
        }
        row["ratios"] = {
            p: {k: (f[k] / ref[k] if ref and ref[k] > 0 else None) for k in RATIOS}
            for p, f in row["policies"].items()
            if p != baseline and ref is not None
        }
    summary: dict[str, Any] = {}
    for p in policies:
        s: dict[str, Any] = {}
        for key in ("token_hit_rate", "share_of_reusable", *RATIOS):
            s[key] = _spread([per_seed[seed]["policies"][p][key] or 0.0 for seed in seeds])
        if p != baseline and baseline in policies:
            s["ratio"] = {
                k: _spread([per_seed[seed]["ratios"][p][k] or 0.0 for seed in seeds])
                for k in RATIOS
            }
        summary[p] = s
    floor_ratio = (
        {k: _spread([per_seed[seed]["floor_ratios"][k] or 0.0 for seed in seeds]) for k in RATIOS}
        if baseline in policies
        else None
    )
    return {
        "seeds": list(seeds),
        "baseline": baseline,
        "reusable_max": _spread([per_seed[s]["reusable_max"] for s in seeds]),
        "per_seed": {str(s): per_seed[s] for s in seeds},
        "summary": summary,
        "floor_ratio": floor_ratio,  # the floor / the baseline: the best any policy could do
    }


def _fields(config: ClusterConfig) -> dict[str, Any]:
    return {f: getattr(config, f) for f in config.__dataclass_fields__}


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def markdown(results: dict[str, Any]) -> str:
    """Per seed: each policy's p50 / p90 / p99 and cached share (of the reusable maximum),
    and the ratios to the baseline; then the median [min-max] over the seeds."""
    baseline = results["baseline"]
    policies = list(results["summary"])
    others = [p for p in policies if p != baseline]
    head = "| seed | requests | reusable max |"
    rule = "|---|---|---|"
    for p in policies:
        head += f" {p} p50 / p90 / p99 s | {p} hit (of max) |"
        rule += "---|---|"
    for p in others:
        head += f" {p}/{baseline} p50 / p90 / p99 |"
        rule += "---|"
    head += f" floor p50 / p90 / p99 s | floor/{baseline} |"
    rule += "---|---|"
    lines = [head, rule]
    for seed, row in results["per_seed"].items():
        line = f"| {seed} | {row['requests']} | {row['reusable_max']:.3f} |"
        for p in policies:
            f = row["policies"][p]
            line += (
                f" {f['ttft_p50_s']:.3f} / {f['ttft_p90_s']:.2f} / {f['ttft_p99_s']:.2f} "
                f"| {f['token_hit_rate']:.3f} ({_r(f['share_of_reusable'])}) |"
            )
        for p in others:
            r = row["ratios"][p]
            line += " " + " / ".join(_r(r[k]) for k in RATIOS) + " |"
        floor = row["ttft_floor"]
        line += " " + " / ".join(f"{floor[k]:.3f}" for k in RATIOS) + " |"
        line += " " + " / ".join(_r(row["floor_ratios"][k]) for k in RATIOS) + " |"
        lines.append(line)

    def spread(s: dict[str, float], digits: int = 2) -> str:
        return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"

    lines += [
        "",
        f"Median [min-max] over {len(results['seeds'])} seeds; ratios are to {baseline} in "
        f"the same seed; reusable maximum {spread(results['reusable_max'], 3)}.",
        "",
        "| policy | p50 ratio | p90 ratio | p99 ratio | token hit | hit of reusable max |",
        "|---|---|---|---|---|---|",
    ]
    for p in policies:
        s = results["summary"][p]
        ratio = s.get("ratio")
        cells = [spread(ratio[k]) for k in RATIOS] if ratio else ["-", "-", "-"]
        lines.append(
            f"| {p} | {' | '.join(cells)} | {spread(s['token_hit_rate'], 3)} "
            f"| {spread(s['share_of_reusable'], 3)} |"
        )
    if results.get("floor_ratio"):
        cells = [spread(results["floor_ratio"][k]) for k in RATIOS]
        lines.append(f"| floor (no policy is below it) | {' | '.join(cells)} | - | - |")
    return "\n".join(lines)
