"""`warmgate trace game`: write the game workload as a Mooncake-format trace (FILE) and its
text sidecar (FILE + `.text.jsonl`) for live replay. Every knob of `GameParams` that shapes
the load has a flag; see `sim.players.params` for what each one models."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from sim.players.encode import to_trace, write_sidecar
from sim.players.params import GameParams
from sim.players.workload import generate
from sim.traces import write_mooncake


def _parser() -> argparse.ArgumentParser:
    d = GameParams()
    p = argparse.ArgumentParser(prog="warmgate trace game", description=__doc__)
    p.add_argument("--players", type=int, default=d.players, help="concurrent players")
    p.add_argument("--minutes", type=float, default=d.minutes, help="trace length")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--block-tokens", type=int, default=64, help="tokens per hash id")
    p.add_argument("--zones", type=int, default=d.zones)
    p.add_argument("--npcs-per-zone", type=int, default=d.npcs_per_zone)
    p.add_argument("--think-median-s", type=float, default=d.think_median_s)
    p.add_argument("--idle-mean-s", type=float, default=d.idle_mean_s)
    p.add_argument("--world-version-mean-s", type=float, default=d.world_version_mean_s)
    p.add_argument("--raid-every-mean-s", type=float, default=d.raid_every_mean_s)
    p.add_argument("--raid-share", type=float, default=d.raid_share)
    p.add_argument("--out", required=True, help="trace file; the sidecar is OUT.text.jsonl")
    p.add_argument("--no-sidecar", action="store_true", help="write the trace only")
    return p


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    try:
        params = GameParams(
            players=args.players,
            minutes=args.minutes,
            seed=args.seed,
            zones=args.zones,
            npcs_per_zone=args.npcs_per_zone,
            think_median_s=args.think_median_s,
            idle_mean_s=args.idle_mean_s,
            world_version_mean_s=args.world_version_mean_s,
            raid_every_mean_s=args.raid_every_mean_s,
            raid_share=args.raid_share,
        )
    except ValueError as exc:
        print(f"warmgate trace game: {exc}", file=sys.stderr)
        return 2
    if args.block_tokens <= 0:
        print("warmgate trace game: --block-tokens must be positive", file=sys.stderr)
        return 2
    started = time.perf_counter()
    requests = generate(params)
    trace = to_trace(requests, args.block_tokens)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_mooncake(out, trace)
    sidecar = None
    if not args.no_sidecar:
        sidecar = Path(str(out) + ".text.jsonl")
        write_sidecar(sidecar, requests)
    tokens = [t.input_length for t in trace]
    summary = {
        "requests": len(trace),
        "trace": str(out),
        "sidecar": str(sidecar) if sidecar else None,
        "sessions": len({t.session for t in trace}),
        "input_tokens_mean": sum(tokens) / len(tokens) if tokens else 0,
        "input_tokens_max": max(tokens, default=0),
        "distinct_blocks": len({h for t in trace for h in t.hash_ids}),
        "seconds": round(time.perf_counter() - started, 2),
    }
    print(json.dumps(summary))
    return 0
