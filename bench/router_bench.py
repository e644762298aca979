"""`warmgate bench router`: how long one routing decision takes and what the index costs.

How it measures:
1. Builds a prefix index the way a busy gateway would have it: `--index-entries`
   (block, instance) entries over `--instances` instances, as predict-on-route chains of
   `--prompt-tokens`-token prompts that share zone world-state prefixes, plus the real
   chains of the prompts that will be routed (each already seen on one or two instances).
   The fill runs under `tracemalloc`: `bytes_per_entry` is every byte still allocated by
   the index afterwards (keys, packed values, prediction bookkeeping) ÷ its entries.
2. Times the whole decision for a `--prompt-tokens` chat prompt, `--iterations` times:
   canonical rendering, cutting into chained-hash blocks (approximate mode), the index
   lookup over every instance, the load view and the policy (`--policy`; default `ttft`,
   the product's default).
   Writes `decision_us_p50`, `decision_us_p99` (wall clock, and the parts) to `--json` and
   prints a table. Wall time includes any descheduling on a busy machine, so the thread's
   CPU time per decision is reported beside it (`decision_cpu_us_*`).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import sys
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from router.blocks import CHARS_PER_TOKEN, chain_seed, estimate_tokens, hash_blocks, render_chat
from router.index import PrefixIndex
from router.load import LoadView
from router.policies.registry import default_registry
from router.router import Router
from router.types import RouteRequest

MODEL = "bench-model"
WORDS = tuple(
    [
        "the",
        "of",
        "guard",
        "tavern",
        "quest",
        "dragon",
        "gold",
        "sword",
        "village",
        "forest",
        "ancient",
        "river",
        "merchant",
        "rumour",
        "north",
        "gate",
        "king",
        "night",
        "fire",
        "stone",
        "path",
        "shadow",
        "old",
        "friend",
        "road",
        "inn",
        "price",
    ]
)


def _text(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(WORDS)
        words.append(w)
        n += len(w) + 1
    return " ".join(words)[:chars]


def _prompts(
    rng: random.Random, count: int, zones: int, prompt_tokens: int
) -> tuple[list[list[dict[str, str]]], list[str]]:
    """Chat prompts laid out stable -> volatile: zone world state (a quarter of the prompt),
    NPC persona, then the player's own dialogue."""
    chars = prompt_tokens * CHARS_PER_TOKEN
    world = [_text(rng, chars // 4) for _ in range(zones)]
    persona = [_text(rng, chars // 16) for _ in range(zones * 2)]
    prompts: list[list[dict[str, str]]] = []
    for k in range(count):
        z = k % zones
        head = f"{world[z]}\n{persona[(k * 7) % len(persona)]}"
        prompts.append(
            [
                {"role": "system", "content": head},
                {"role": "user", "content": _text(rng, chars - len(head) - 24)},
            ]
        )
    return prompts, world


def _fill(
    index: PrefixIndex,
    rng: random.Random,
    instances: list[str],
    entries: int,
    chains: list[list[int]],
    world_chains: list[list[int]],
    chain_blocks: int,
) -> None:
    now = 0.0
    for k, chain in enumerate(chains):  # the routed prompts: seen before on 1-2 instances
        for j in range(1 + k % 2):
            index.insert(instances[(k + 5 * j) % len(instances)], chain, predicted=True, now=now)
    k = 0
    while len(index) < entries:  # other players' chains sharing a zone's world prefix
        prefix = world_chains[k % len(world_chains)]
        tail = [rng.getrandbits(64) for _ in range(max(0, chain_blocks - len(prefix)))]
        chain = prefix + tail
        missing = entries - len(index)
        if len(chain) > missing:
            chain = tail[:missing]
        index.insert(instances[k % len(instances)], chain, predicted=True, now=now)
        k += 1


def _pct(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    instances = [f"inst-{k:02d}" for k in range(args.instances)]
    seed = chain_seed(MODEL)
    block_chars = args.block_tokens * CHARS_PER_TOKEN
    prompts, worlds = _prompts(rng, args.prompts, args.zones, args.prompt_tokens)
    texts = [render_chat(p) for p in prompts]
    chains = [hash_blocks(t, seed=seed, block_chars=block_chars) for t in texts]
    world_chains = [
        hash_blocks(render_chat([{"role": "system", "content": w}]), seed=seed)[:-1] for w in worlds
    ]
    chain_blocks = max(len(c) for c in chains)
    per_instance = -(-args.index_entries // args.instances)

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    index = PrefixIndex(ttl_s=1e9, capacity_blocks=2 * per_instance + chain_blocks)
    _fill(index, rng, instances, args.index_entries, chains, world_chains, chain_blocks)
    gc.collect()
    index_bytes = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()

    clock_now = [1.0]
    load = LoadView()
    for name in instances:  # a loaded cluster: 4-16 requests in flight per instance
        for _ in range(rng.randint(4, 16)):
            load.on_dispatch(name, rng.randint(1000, 40000))
    router = Router(default_registry().create(args.policy), index, load, clock=lambda: clock_now[0])

    total: list[float] = []
    render: list[float] = []
    blocks: list[float] = []
    decide: list[float] = []
    cpu: list[float] = []  # thread CPU time: what the decision costs, descheduling excluded
    chosen: dict[str, int] = {}
    cached = 0
    ns = time.perf_counter_ns
    cpu_ns = time.thread_time_ns
    for it in range(args.warmup + args.iterations):
        messages = prompts[it % len(prompts)]
        c0 = cpu_ns()
        t0 = ns()
        text = render_chat(messages)
        t1 = ns()
        hashes = hash_blocks(text, seed=seed, block_chars=block_chars)
        t2 = ns()
        request = RouteRequest(
            model=MODEL,
            block_hashes=hashes,
            block_tokens=args.block_tokens,
            prompt_tokens=estimate_tokens(text),
            session_key=f"player-{it % len(prompts)}",
        )
        decision = router.route(request, instances)
        t3 = ns()
        c3 = cpu_ns()
        if it >= args.warmup:
            cpu.append((c3 - c0) / 1000)
            total.append((t3 - t0) / 1000)
            render.append((t1 - t0) / 1000)
            blocks.append((t2 - t1) / 1000)
            decide.append((t3 - t2) / 1000)
            chosen[decision.instance] = chosen.get(decision.instance, 0) + 1
            cached += decision.cached_tokens
    for series in (total, render, blocks, decide, cpu):
        series.sort()
    n = len(total)
    return {
        "policy": args.policy,
        "instances": args.instances,
        "prompt_tokens": args.prompt_tokens,
        "prompt_blocks": chain_blocks,
        "block_tokens": args.block_tokens,
        "iterations": n,
        "decision_us_p50": round(_pct(total, 50), 1),
        "decision_us_p99": round(_pct(total, 99), 1),
        "decision_us_mean": round(sum(total) / n, 1),
        "decision_us_max": round(total[-1], 1),
        "decision_cpu_us_p50": round(_pct(cpu, 50), 1),
        "decision_cpu_us_p99": round(_pct(cpu, 99), 1),
        "render_us_p50": round(_pct(render, 50), 1),
        "hash_blocks_us_p50": round(_pct(blocks, 50), 1),
        "route_us_p50": round(_pct(decide, 50), 1),
        "route_us_p99": round(_pct(decide, 99), 1),
        "index_entries": len(index),
        "index_distinct_blocks": index.distinct_blocks(),
        "index_bytes": index_bytes,
        "bytes_per_entry": round(index_bytes / max(1, len(index)), 1),
        "memory_method": "tracemalloc: bytes allocated by the index fill and still live",
        "mean_predicted_cached_tokens": round(cached / n, 1),
        "instances_chosen": len(chosen),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def _table(r: dict[str, Any]) -> str:
    rows = [
        ("policy", r["policy"]),
        ("instances", r["instances"]),
        ("prompt tokens / blocks", f"{r['prompt_tokens']} / {r['prompt_blocks']}"),
        ("decision p50 / p99 (µs)", f"{r['decision_us_p50']} / {r['decision_us_p99']}"),
        (
            "  thread CPU p50 / p99 (µs)",
            f"{r['decision_cpu_us_p50']} / {r['decision_cpu_us_p99']}",
        ),
        (
            "  render / blocks / route p50 (µs)",
            f"{r['render_us_p50']} / {r['hash_blocks_us_p50']} / {r['route_us_p50']}",
        ),
        ("index entries", r["index_entries"]),
        ("bytes per entry", r["bytes_per_entry"]),
    ]
    width = max(len(k) for k, _ in rows)
    lines = ["| metric | value |", "|---|---|"]
    lines += [f"| {k.ljust(width)} | {v} |" for k, v in rows]
    return "\n".join(lines)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="warmgate bench router", description=__doc__.split("\n")[0])
    p.add_argument("--instances", type=int, default=16)
    p.add_argument("--index-entries", type=int, default=1_000_000)
    p.add_argument("--prompt-tokens", type=int, default=32768)
    p.add_argument("--block-tokens", type=int, default=64)
    p.add_argument("--policy", default="ttft", help="routing policy (default: the product default)")
    p.add_argument("--iterations", type=int, default=5000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--prompts", type=int, default=32, help="distinct prompts routed in turn")
    p.add_argument("--zones", type=int, default=4, help="distinct world-state prefixes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(list(argv))
    for name in ("instances", "index_entries", "prompt_tokens", "block_tokens", "iterations"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.policy not in default_registry().names():
        p.error(f"unknown policy {args.policy!r}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    result = run(args)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(_table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
