"""Warm on vs off in one run (issue 22, item 1): first-line TTFT of dialogues that were warmed
(`POST /v1/warm` a few seconds before the line, as a game server does when a player walks up
to an NPC) against dialogues that were not, interleaved on the same fleet and gateway.

Each dialogue has its own long NPC prompt (nothing shared between dialogues), so a cold first
line pays its whole prefill. Arrivals are a seeded Poisson process; dialogue i is warmed when
i is even, so both arms see the same load. The next turn of every warmed dialogue checks its
cached tokens against the warmed full blocks.

    python -m bench.warm_ab --dialogues 120 --rate 2 --lead-s 2 --time-scale 1 --seed 7

prints one JSON document: TTFT p50/p99 per arm, warm outcomes, the cached ratio.
`--no-warms` runs the same schedule without warming (the cold arm's baseline: what the warms
did to the real requests beside them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.loadgen import percentile
from bench.sim_fleet import MODEL, SimFleet

BLOCK = 16  # the simulated engine's KV block
_WORDS = ("ash", "oak", "elm", "fir", "yew", "ember", "forge", "anvil", "tongs", "rivet")


@dataclass(frozen=True, slots=True)
class Target:
    """What the requests are sent to: the served model, its KV block, extra body fields
    (real vLLM's random-weight model needs `ignore_eos`), and a salt put in every NPC prompt
    so that rounds on the same engines do not hit each other's cache."""

    model: str = MODEL
    block: int = BLOCK
    extra: dict[str, Any] = field(default_factory=dict)
    salt: str = ""


def npc_prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


async def first_line(
    client: httpx.AsyncClient, messages: list[dict[str, str]], user: str, target: Target
) -> tuple[float | None, int | None, str | None]:
    """(TTFT s to the first content chunk, cached tokens reported, the instance) of one
    streamed line."""
    body = {
        **target.extra,
        "model": target.model,
        "messages": messages,
        "user": user,
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.monotonic()
    ttft = None
    cached = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        instance = r.headers.get("x-warmgate-instance")
        if r.status_code != 200:
            await r.aread()
            return None, None, instance
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if ttft is None and choices and (choices[0].get("delta") or {}).get("content"):
                ttft = time.monotonic() - started
            usage = chunk.get("usage")
            if usage:
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return ttft, cached, instance


async def dialogue(
    client: httpx.AsyncClient,
    i: int,
    at_s: float,
    lead_s: float,
    prompt: str,
    t0: float,
    out: dict[str, list[Any]],
    warms: bool,
    target: Target,
) -> None:
    """Dialogue i: (when warmed) the NPC's context warmed `lead_s` before the player's first
    line, which is that context plus the line."""
    user = f"player-{i}"
    context = [{"role": "system", "content": target.salt + prompt}]
    warmed = i % 2 == 0  # its arm (with --no-warms the even ones are not warmed either)
    warm: dict[str, Any] | None = None
    if warmed and warms:
        await asyncio.sleep(max(0.0, t0 + at_s - lead_s - time.monotonic()))
        body = {"model": target.model, "messages": context, "user": user}
        r = await client.post("/v1/warm", json=body)
        if r.status_code == 200:
            warm = r.json()
            out["warms"].append(warm)
        else:
            out["warm_refused"].append(r.status_code)
    await asyncio.sleep(max(0.0, t0 + at_s - time.monotonic()))
    line = [*context, {"role": "user", "content": "Hello! Have you any work for me?"}]
    ttft, cached, instance = await first_line(client, line, user, target)
    arm = "warm" if warmed else "cold"
    if ttft is None:
        out[f"{arm}_failed"].append(i)
        return
    out[arm].append(ttft)
    out["lines"].append(
        {
            "i": i,
            "ttft_s": round(ttft, 4),
            "cached": cached,
            "instance": instance,
            "warm": None if warm is None else {k: warm[k] for k in ("instance", "source", "ms")},
        }
    )
    if warm is not None and cached is not None:
        full = (warm["prompt_tokens"] - 1) // target.block * target.block
        if full:
            out["cached_ratio"].append(cached / full)
            if cached < full // 2:
                out["uncached"].append({"i": i, "line_instance": instance, "warm": warm})


async def run(args: argparse.Namespace, base: str, target: Target | None = None) -> dict[str, Any]:
    """One round of the schedule against the gateway at `base` (warms unless --no-warms)."""
    target = target or Target()
    rng = random.Random(args.seed)
    at = 0.0
    plan = []
    for i in range(args.dialogues):
        at += rng.expovariate(args.rate)
        plan.append((i, args.lead_s + at, npc_prompt(rng, args.prompt_words)))
    keys = [
        "warm",
        "cold",
        "warms",
        "warm_refused",
        "warm_failed",
        "cold_failed",
        "cached_ratio",
        "lines",
        "uncached",
    ]
    out: dict[str, list[Any]] = {k: [] for k in keys}
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as client:
        t0 = time.monotonic()
        await asyncio.gather(
            *(
                dialogue(client, i, a, args.lead_s, p, t0, out, not args.no_warms, target)
                for i, a, p in plan
            )
        )
        stats = (await client.get("/admin/stats")).json()

    def summary(values: list[float]) -> dict[str, Any]:
        return {
            "n": len(values),
            "p50_s": percentile(values, 50),
            "p99_s": percentile(values, 99),
        }

    sources: dict[str, int] = {}
    for w in out["warms"]:
        sources[w["source"]] = sources.get(w["source"], 0) + 1
    ratios = out["cached_ratio"]
    return {
        "args": vars(args),
        "first_line_ttft": {"warm": summary(out["warm"]), "cold": summary(out["cold"])},
        "failed": {"warm": len(out["warm_failed"]), "cold": len(out["cold_failed"])},
        "warms": {"ok_by_source": sources, "refused": len(out["warm_refused"])},
        "warmed_first_line_cached_over_full_blocks": {
            "n": len(ratios),
            "mean": sum(ratios) / len(ratios) if ratios else None,
            "min": min(ratios) if ratios else None,
        },
        "gateway_warm_stats": stats.get("warm"),
        "warmed_lines_mostly_uncached": out["uncached"],
        "slowest_lines": sorted(out["lines"], key=lambda d: -d["ttft_s"])[:8],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.warm_ab", description=__doc__)
    p.add_argument("--dialogues", type=int, default=120)
    p.add_argument("--rate", type=float, default=2.0, help="dialogue starts per second")
    p.add_argument("--lead-s", type=float, default=2.0, help="warm this long before the line")
    p.add_argument("--prompt-words", type=int, default=1500, help="NPC prompt length")
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--no-warms", action="store_true", help="the same schedule with no warm: the baseline"
    )
    p.add_argument("--run-dir", type=Path, default=None)
    args = p.parse_args(argv)
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="warm-ab-"))
    fleet = SimFleet(run_dir, instances=args.instances, time_scale=args.time_scale).start()
    try:
        result = asyncio.run(run(args, fleet.gateway_urls[0]))
    finally:
        fleet.stop()
    result["args"]["run_dir"] = str(run_dir)
    json.dump(result, sys.stdout, indent=2, default=str)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
