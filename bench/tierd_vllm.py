"""tierd's connector on real vLLM engines: what the tiers save a CPU engine.

    python -m bench.tierd_vllm --json bench/results/tierd-vllm.json --md bench/results/tierd-vllm.md

Two engines (one core each, the tiny local model, block size 128) each with a tierd and one
shared array (`gateway.launch.tiered`), then the same two engines without the connector.
TTFT is the time to the first streamed chunk that carries text (`skip_special_tokens` off,
`ignore_eos` on, so every reply is text); recompute baselines run in the same sitting.

1. Lookup round trip on the KV socket (the scheduler's blocking call): a real tierd, a
   23-block chain, held and missed, from the connector's own client.
2. Cross-instance reuse: engine A computes a prompt; engine B serves the same prompt (from
   the array) and a salted copy (`cache_salt`: the same tokens hash differently, so B
   recomputes). Bytes and time moved from the connector's counters.
3. Snapshot restore: a prompt A computed is written as one snapshot object by B's tierd,
   then removed from the array and from B's L1; B serves it from the snapshot, against B's
   recompute of it.
4. Dialogues whose turns alternate between the engines (what a gateway without session
   affinity, or one rebalancing load, does): TTFT p50 and throughput with the array against
   vLLM's own prefix cache alone, at 1 and 2 dialogues per engine at a time, on the same
   fleet in ABBA order (the machine is shared and its load drifts by the minute): the
   baseline salts each dialogue per engine, so only an engine's own cache can hit; it still
   pays the connector's lookups and saves, so it flatters the baseline's cost a little less
   than engines without the connector would (`--plain` runs those too, afterwards).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from bench.report import pct
from bench.tierd_vllm_report import markdown
from gateway.launch.models import ensure_tiny_model
from gateway.launch.tiered import TierdProcess, TieredConfig, TieredFleet
from gateway.launch.vllm_fleet import FleetConfig, VllmFleet
from tierd.kvwire import KvClient

MODEL = "warmgate-tiny"
BLOCK = 128


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 4000) for _ in range(n)]


async def ttft(
    client: httpx.AsyncClient, url: str, ids: list[int], salt: str | None = None, n: int = 4
) -> dict[str, Any]:
    """Time to the first text chunk, the reply's token ids and cached_tokens."""
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": ids,
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
        "skip_special_tokens": False,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    if salt is not None:
        body["cache_salt"] = salt
    t0 = time.perf_counter()
    first: float | None = None
    out_ids: list[int] = []
    cached = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for ch in chunk.get("choices") or []:
                if first is None and ch.get("text"):
                    first = time.perf_counter() - t0
                out_ids += ch.get("token_ids") or []
            usage = chunk.get("usage")
            if usage:
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"ttft_s": first, "ids": out_ids, "cached": cached}


def lookup_rtt(run_dir: Path, rounds: int = 2000) -> dict[str, Any]:
    """The KV socket's lookup round trip from the connector's client (a real tierd)."""
    tierd = TierdProcess(
        "tierd-rtt",
        run_dir,
        [
            sys.executable,
            "-m",
            "tierd.cli",
            "serve",
            "--l1-bytes",
            str(64 * 1024 * 1024),
            "--slice-bytes",
            str(64 * 1024),
            "--array-dir",
            str(run_dir / "rtt-array"),
            "--snapshot-dir",
            str(run_dir / "rtt-snap"),
        ],
    )
    tierd.start()
    try:
        c = KvClient(str(tierd.socket), "bench", "worker")
        chain = list(range(1, 24))
        offsets = c.call({"op": "reserve", "n": len(chain)})["offsets"]
        items = [[h, o, 4096, h - 1 or None, BLOCK] for h, o in zip(chain, offsets, strict=True)]
        c.send({"op": "commit", "items": items})
        time.sleep(0.5)
        out: dict[str, Any] = {}
        for label, hashes in (
            ("held_23_blocks", chain),
            ("missed_23_blocks", [h + 10**9 for h in chain]),
        ):
            samples = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                c.call({"op": "lookup", "hashes": hashes})
                samples.append((time.perf_counter() - t0) * 1e6)
            out[label] = {"p50_us": pct(samples, 50), "p99_us": pct(samples, 99), "n": rounds}
        c.close()
        return out
    finally:
        tierd.stop()


async def cross_instance(fleet: TieredFleet, prompts: int, length: int) -> dict[str, Any]:
    a, b = fleet.instances
    rows = []
    async with httpx.AsyncClient(timeout=600.0, trust_env=False) as client:
        for i in range(prompts):
            ids = tokens(1000 + i, length)
            w0 = await asyncio.to_thread(_written_now, fleet)
            cold = await ttft(client, a.engine.url, ids)
            await _written(fleet, w0 + (length - 1) // BLOCK)
            before = b.stats()
            served = await ttft(client, b.engine.url, ids)
            after = b.stats()
            recompute = await ttft(client, b.engine.url, ids, salt=str(uuid.uuid4()))
            rows.append(
                {
                    "a_cold_ttft_s": cold["ttft_s"],
                    "b_from_array_ttft_s": served["ttft_s"],
                    "b_recompute_ttft_s": recompute["ttft_s"],
                    "b_cached_tokens": served["cached"],
                    "same_ids_as_recompute": served["ids"] == recompute["ids"],
                    "bytes_loaded": after.get("loaded_bytes", 0) - before.get("loaded_bytes", 0),
                    "load_s": (after.get("load_us", 0) - before.get("load_us", 0)) / 1e6,
                }
            )
    return {"prompt_tokens": length, "rows": rows, **_medians(rows)}


def _written_now(fleet: TieredFleet) -> int:
    return int(fleet.instances[0].tierd.stats()["connector"].get("write_through_blocks", 0))


async def _written(fleet: TieredFleet, target: int, within_s: float = 60.0) -> None:
    """Until tierd A has written `target` blocks through to the array in all."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if await asyncio.to_thread(_written_now, fleet) >= target:
            return
        await asyncio.sleep(0.1)


def _medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k, v in rows[0].items() if isinstance(v, float | int) and not isinstance(v, bool)]
    return {f"median_{k}": statistics.median(r[k] for r in rows if r[k] is not None) for k in keys}


async def snapshot_restore(fleet: TieredFleet, prompts: int, length: int) -> dict[str, Any]:
    a, b = fleet.instances
    rows = []
    async with httpx.AsyncClient(timeout=600.0, trust_env=False) as client:
        for i in range(prompts):
            ids = tokens(2000 + i, length)
            before_files = set(fleet.array_dir.glob("??/*.slice"))
            w0 = await asyncio.to_thread(_written_now, fleet)
            await ttft(client, a.engine.url, ids)
            await _written(fleet, w0 + (length - 1) // BLOCK)
            chain = fleet.chain_since(before_files)
            snap = (
                await client.post(
                    f"{b.tierd.url}/v1/snapshot", json={"hashes": chain, "wait": True}
                )
            ).json()
            for tier, inst in (("GPU", b), ("ARRAY", a), ("ARRAY", b)):
                await client.post(
                    f"{inst.tierd.url}/v1/evict", json={"hashes": chain, "tier": tier}
                )
            t_before = await asyncio.to_thread(b.tierd.stats)
            served = await ttft(client, b.engine.url, ids)
            t_after = await asyncio.to_thread(b.tierd.stats)
            recompute = await ttft(client, b.engine.url, ids, salt=str(uuid.uuid4()))
            rows.append(
                {
                    "snapshot_slices": snap.get("slices"),
                    "snapshot_object_bytes": snap.get("object_bytes"),
                    "b_from_snapshot_ttft_s": served["ttft_s"],
                    "b_recompute_ttft_s": recompute["ttft_s"],
                    "b_cached_tokens": served["cached"],
                    "same_ids_as_recompute": served["ids"] == recompute["ids"],
                    "snapshot_hits": t_after["hits"].get("snapshot", 0)
                    - t_before["hits"].get("snapshot", 0),
                    "snapshot_bytes_to_l1": t_after["bytes_moved"].get("snapshot_to_l1", 0)
                    - t_before["bytes_moved"].get("snapshot_to_l1", 0),
                }
            )
    return {"prompt_tokens": length, "rows": rows, **_medians(rows)}


async def dialogues(
    urls: Sequence[str],
    per_engine: int,
    turns: int,
    first: int,
    step: int,
    seed: int,
    *,
    shared: bool,
    tag: str,
) -> dict[str, Any]:
    """`per_engine * len(urls)` dialogues at once; turn t of dialogue d goes to engine
    (d + t) mod n, so every turn after the first lands where the last one did not run.

    Every request carries a `cache_salt`: with `shared`, one per dialogue (the engines'
    block hashes agree, so the other engine's blocks are found in the array); without, one
    per dialogue and engine (the same tokens hash differently on each engine: only vLLM's
    own prefix cache can hit, the same fleet and minute as the shared run)."""
    n = per_engine * len(urls)
    samples: list[float] = []
    cached: list[int] = []
    prompt_tokens = 0

    async def one(d: int) -> None:
        nonlocal prompt_tokens
        history = tokens(seed * 1000 + d, first)
        async with httpx.AsyncClient(timeout=900.0, trust_env=False) as client:
            for t in range(turns):
                e = (d + t) % len(urls)
                salt = f"{tag}-d{d}" if shared else f"{tag}-d{d}-e{e}"
                r = await ttft(client, urls[e], history, salt=salt, n=16)
                if r["ttft_s"] is not None:
                    samples.append(r["ttft_s"])
                cached.append(r["cached"])
                prompt_tokens += len(history)
                history = [*history, *r["ids"], *tokens(seed * 7919 + d * 31 + t, step)]

    t0 = time.perf_counter()
    await asyncio.gather(*(one(d) for d in range(n)))
    wall = time.perf_counter() - t0
    return {
        "dialogues": n,
        "turns": turns,
        "requests": len(cached),
        "ttft_p50_s": pct(samples, 50),
        "ttft_p90_s": pct(samples, 90),
        "requests_per_s": len(cached) / wall,
        "prompt_tokens_per_s": prompt_tokens / wall,
        "cached_share": sum(cached) / max(1, prompt_tokens),
        "wall_s": wall,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    model = await asyncio.to_thread(ensure_tiny_model)
    run_dir = Path(tempfile.mkdtemp(prefix="wg-tb-"))
    out: dict[str, Any] = {"lookup_rtt": await asyncio.to_thread(lookup_rtt, run_dir)}

    def keep() -> None:  # what is measured so far survives a later failure
        if args.json_out:
            args.json_out.write_text(json.dumps(out, indent=1))

    base = FleetConfig(model_dir=model, engines=2, served_model_name=MODEL, kv_events=True)
    loads: list[dict[str, Any]] = []
    tiered = TieredFleet(TieredConfig(replace(base, run_dir=run_dir / "t")))
    await asyncio.to_thread(tiered.start)
    try:
        urls = [e.url for e in tiered.engines]
        await _warm(urls)
        out["cross_instance"] = await cross_instance(tiered, args.prompts, args.length)
        keep()
        out["snapshot_restore"] = await snapshot_restore(tiered, args.prompts, args.length)
        keep()
        # ABBA order: the machine's load drifts (it is shared), each pair sees the same drift
        for c, shared in ((1, True), (1, False), (2, False), (2, True)):
            got = await dialogues(
                urls, c, args.turns, args.first, args.step, seed=10 + c, shared=shared,
                tag=uuid.uuid4().hex[:8],
            )  # fmt: skip
            loads.append(
                {"mode": "array" if shared else "prefix_cache_only", "per_engine": c, **got}
            )
            keep()
        out["tierd_stats"] = [await asyncio.to_thread(i.tierd.stats) for i in tiered.instances]
        out["connector_stats"] = [i.stats() for i in tiered.instances]
        out["dialogues"] = loads
        keep()
    finally:
        await asyncio.to_thread(tiered.stop)
    if args.plain:  # the same dialogues on engines without the connector (another minute)
        plain = VllmFleet(replace(base, run_dir=run_dir / "p"))
        await asyncio.to_thread(plain.start)
        try:
            urls = [e.url for e in plain.engines]
            await _warm(urls)
            for c in (1, 2):
                got = await dialogues(
                    urls, c, args.turns, args.first, args.step, seed=10 + c, shared=False,
                    tag=uuid.uuid4().hex[:8],
                )  # fmt: skip
                loads.append({"mode": "no_connector", "per_engine": c, **got})
                keep()
        finally:
            await asyncio.to_thread(plain.stop)
    out["dialogues"] = sorted(loads, key=lambda d: (d["per_engine"], d["mode"]))
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


async def _warm(urls: Sequence[str]) -> None:
    """The first request after a start costs 1.5-3 s extra: one of its own on each engine."""
    async with httpx.AsyncClient(timeout=300.0, trust_env=False) as client:
        for i, url in enumerate(urls):
            await ttft(client, url, tokens(999_000 + i, 200))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tierd_vllm", description=__doc__)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--length", type=int, default=3000)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--first", type=int, default=1500, help="first turn's prompt tokens")
    p.add_argument("--step", type=int, default=150, help="new user tokens per turn")
    p.add_argument("--plain", action="store_true", help="also engines without the connector")
    p.add_argument("--json", dest="json_out", type=Path)
    p.add_argument("--md", dest="md_out", type=Path)
    args = p.parse_args(argv)
    result = asyncio.run(run(args))
    text = markdown(result)
    print(text)
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=1))
    if args.md_out:
        args.md_out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
