"""The connector's save path on real vLLM engines: synchronous against off the critical path.

    python -m bench.save_path --json bench/results/save-path.json --md bench/results/save-path.md

One fleet of two engines (one core each, the tiny local model, block size 128), each with a
tierd and the connector, one shared array: engine 0 saves synchronously in `wait_for_save`
(before this change), engine 1 with `tierd.connector.saver` (copy in a thread, the next step
waits only for what is left). Both get the same shape of traffic at the same time, each its
own prompts: cold prompts, then a next turn of each (its prefix from the engine's own cache,
new blocks saved). Then each engine serves the other's prompts from the array and a salted
copy (its recompute): the greedy token ids must agree, which checks that the asynchronous
saves stored the right bytes. Per engine, from the connector's counters: blocks saved, the
save's own time per block, and the time per block the engine's step waited for it (sync: all
of it; async: `save_wait_us`). The KV socket's lookup round trip is measured too
(`bench.tierd_vllm.lookup_rtt`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.report import pct
from bench.tierd_vllm import BLOCK, lookup_rtt, tokens, ttft
from gateway.launch.models import ensure_tiny_model
from gateway.launch.tiered import TieredConfig, TieredFleet, TieredInstance
from gateway.launch.vllm_fleet import FleetConfig

MODES = ("sync", "async")


def _written(inst: TieredInstance) -> int:
    return int(inst.tierd.stats()["connector"].get("write_through_blocks", 0))


async def _until_written(inst: TieredInstance, target: int, within_s: float = 60.0) -> None:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if await asyncio.to_thread(_written, inst) >= target:
            return
        await asyncio.sleep(0.1)


async def _turns(
    client: httpx.AsyncClient, inst: TieredInstance, seed: int, prompts: int, length: int
) -> dict[str, list[float]]:
    cold, turn = [], []
    for i in range(prompts):
        ids = tokens(seed + i, length)
        r = await ttft(client, inst.engine.url, ids, n=16)
        cold.append(r["ttft_s"])
        r = await ttft(client, inst.engine.url, ids + tokens(seed + 500 + i, 300), n=16)
        turn.append(r["ttft_s"])
    return {"cold": cold, "turn": turn}


async def _cross(
    client: httpx.AsyncClient, src: TieredInstance, dst: TieredInstance, seed: int, length: int
) -> dict[str, Any]:
    """`dst` serves a prompt `src` computed (and saved) from the array; against its recompute."""
    ids = tokens(seed, length)
    w0 = await asyncio.to_thread(_written, src)
    await ttft(client, src.engine.url, ids)
    await _until_written(src, w0 + (length - 1) // BLOCK)
    served = await ttft(client, dst.engine.url, ids)
    recompute = await ttft(client, dst.engine.url, ids, salt=str(uuid.uuid4()))
    return {
        "cached_tokens": served["cached"],
        "ttft_s": served["ttft_s"],
        "recompute_ttft_s": recompute["ttft_s"],
        "same_ids_as_recompute": served["ids"] == recompute["ids"],
    }


def _mode_row(counters: dict[str, int], turns: dict[str, list[float]], mode: str) -> dict[str, Any]:
    saved = counters.get("saved_blocks", 0) or 1
    on_path_us = counters.get("save_us", 0) if mode == "sync" else counters.get("save_wait_us", 0)
    return {
        "mode": mode,
        "ttft_cold_p50_s": statistics.median(turns["cold"]),
        "ttft_turn_p50_s": statistics.median(turns["turn"]),
        "ttft_turn_p90_s": pct(turns["turn"], 90),
        "saved_blocks": counters.get("saved_blocks", 0),
        "save_ms_per_block": round(counters.get("save_us", 0) / saved / 1000, 3),
        "critical_path_ms_per_block": round(on_path_us / saved / 1000, 3),
        "save_waits": counters.get("save_waits", 0),
        "save_skipped_blocks": counters.get("save_skipped_blocks", 0),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="wg-save-"))
    rtt = await asyncio.to_thread(lookup_rtt, run_dir)
    fc = FleetConfig(model_dir=ensure_tiny_model(), engines=2, run_dir=run_dir)
    fleet = TieredFleet(TieredConfig(fc, saves=MODES))
    await asyncio.to_thread(fleet.start)
    try:
        async with httpx.AsyncClient(timeout=600.0, trust_env=False) as client:
            for inst in fleet.instances:  # the first request after a start costs seconds
                await ttft(client, inst.engine.url, tokens(7 + inst.engine.index, 200))
            a, b = fleet.instances
            turns = await asyncio.gather(
                _turns(client, a, 10_000, args.prompts, args.tokens),
                _turns(client, b, 20_000, args.prompts, args.tokens),
            )
            counters = [inst.stats() for inst in fleet.instances]
            cross = [
                await _cross(client, b, a, 30_000 + i, args.tokens) for i in range(args.cross)
            ] + [await _cross(client, a, b, 40_000 + i, args.tokens) for i in range(args.cross)]
    finally:
        await asyncio.to_thread(fleet.stop)
    return {
        "command": "python -m bench.save_path " + " ".join(sys.argv[1:]),
        "prompt_tokens": args.tokens,
        "prompts_per_engine": args.prompts,
        "modes": [_mode_row(c, t, m) for c, t, m in zip(counters, turns, MODES, strict=True)],
        "cross": {
            "async_saved_loaded_by_sync": cross[: args.cross],
            "sync_saved_loaded_by_async": cross[args.cross :],
        },
        "lookup_rtt": rtt,
    }


def render(res: dict[str, Any]) -> str:
    lines = [
        "| save | TTFT cold p50 s | TTFT next turn p50 s | p90 s | blocks saved | "
        "save ms/block | on the critical path ms/block | steps that waited |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in res["modes"]:
        lines.append(
            f"| {m['mode']} | {m['ttft_cold_p50_s']:.3f} | {m['ttft_turn_p50_s']:.3f} | "
            f"{m['ttft_turn_p90_s']:.3f} | {m['saved_blocks']} | {m['save_ms_per_block']} | "
            f"{m['critical_path_ms_per_block']} | {m['save_waits']} |"
        )
    lines += ["", "| saved by, loaded by | cached | TTFT s | recompute s | ids = recompute |",
              "|---|---:|---:|---:|---|"]  # fmt: skip
    for label, rows in res["cross"].items():
        for r in rows:
            lines.append(
                f"| {label} | {r['cached_tokens']} | {r['ttft_s']:.3f} | "
                f"{r['recompute_ttft_s']:.3f} | {'yes' if r['same_ids_as_recompute'] else 'NO'} |"
            )
    rtt = res["lookup_rtt"]
    lines += ["", "| lookup (23 blocks) | p50 µs | p99 µs |", "|---|---:|---:|"]
    for k, v in rtt.items():
        lines.append(f"| {k} | {v['p50_us']:.0f} | {v['p99_us']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.save_path", description=__doc__)
    p.add_argument("--prompts", type=int, default=4, help="cold prompts per engine")
    p.add_argument("--tokens", type=int, default=2000, help="prompt tokens")
    p.add_argument("--cross", type=int, default=2, help="cross-engine checks each way")
    p.add_argument("--json", dest="json_out")
    p.add_argument("--md", dest="md_out")
    args = p.parse_args(argv)
    res = asyncio.run(run(args))
    md = render(res)
    print(md)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=1) + "\n")
    if args.md_out:
        Path(args.md_out).write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
