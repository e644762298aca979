"""Interactive TTFT beside background load on a real vLLM engine (issue 22 item 3's measure:
interactive p99 with background load at 2x capacity against without it, target <= 1.2x).

    python -m bench.priority_real --seconds 60 --repeats 2 --out bench/results/<dir>

One fresh vLLM engine (`bench.real_fleet`, the tiny local model, one core) started with
`--scheduling-policy priority`, behind warmgate-ttft, which marks it `priority_scheduling`
and sends each class's vLLM priority. First the engine's capacity: completions per second of
background-sized requests in a closed loop. Then, in arms whose order is rotated each
repeat, interactive requests arrive open-loop (Poisson, `--interactive-rate`) for
`--seconds`:
- `alone`: nothing else (the baseline);
- `background`: background requests arrive beside them at `--background-factor` x capacity,
  sent with `x-warmgate-priority: background` (the gateway sheds them past
  `priority.background_max_in_flight`, vLLM runs interactive ones first);
- `unclassed`: the same background load sent with no class (what priority buys);
- `ungated`: the same classed background load through a second warmgate in front of the same
  engine, started with `priority.background_prefills: 0` (what the gateway's one background
  prefill at a time buys, gateway/pipeline/prefill_gate.py).

Every arm of a repeat replays the same interactive arrivals and texts (common random
numbers: the ratio to alone's compares the same lines), each prompt salted by arm and repeat
so nothing is cached across requests; streamed, TTFT at the first content chunk
(bench.replay.send_one). Writes `results.json` and `report.md`, with each arm's lines pooled
over the repeats beside the per-repeat rows."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.peers import start_gateway
from bench.real_fleet import (
    VLLM_BODY_EXTRA,
    RealFleetSpec,
    add_step_option,
    real_fleet_with_gateway,
    step_engine_args,
)
from bench.replay import RequestRecord, send_one
from bench.report import pct

GATEWAY = "warmgate-ttft"
ARMS = ("alone", "background", "unclassed", "ungated")
UNGATED_ENV = {"WARMGATE_PRIORITY__BACKGROUND_PREFILLS": "0"}


def _body(model: str, rng: random.Random, salt: str, words: int, max_tokens: int) -> Any:
    text = " ".join(f"{rng.getrandbits(24):06x}" for _ in range(words))
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"{salt} {text}"}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        **VLLM_BODY_EXTRA,
    }


async def _send(
    client: httpx.AsyncClient, url: str, body: Any, headers: dict[str, str] | None
) -> RequestRecord:
    record = RequestRecord(index=0, scheduled_s=0.0, sent=True)
    await send_one(client, url, body, record, instance_by_url={}, headers=headers)
    return record


def plan(
    model: str, arm: str, rep: int, kind: str, n: int, rate: float, args: Any
) -> list[tuple[float, Any]]:
    """`n` requests of `kind` ("i" interactive, "b" background) for one arm of a repeat:
    (gap before it in seconds, Poisson at `rate`; body). Common random numbers: every arm
    of a repeat gets the same gaps and texts, only the salt that opens each prompt is the
    arm's (so no arm reuses another's blocks), and an arm's ratio to alone's compares the
    same lines rather than two draws of a Poisson clump."""
    rng = random.Random(args.seed * 1000 + rep * 10 + (kind == "b"))
    tokens = args.interactive_tokens if kind == "i" else args.background_tokens
    bodies = [_body(model, rng, f"{arm}-{rep}-{kind}{k}", args.words, tokens) for k in range(n)]
    return [(rng.expovariate(rate), body) for body in bodies]


async def open_loop(
    client: httpx.AsyncClient,
    url: str,
    planned: list[tuple[float, Any]],
    headers: dict[str, str] | None,
) -> list[RequestRecord]:
    """Send the `planned` bodies, each after its gap; every record, in order."""
    tasks = []
    t = time.perf_counter()
    for gap, body in planned:
        t += gap
        await asyncio.sleep(max(0.0, t - time.perf_counter()))
        tasks.append(asyncio.create_task(_send(client, url, body, headers)))
    return list(await asyncio.gather(*tasks))


async def capacity(
    client: httpx.AsyncClient, url: str, model: str, args: argparse.Namespace
) -> float:
    """Completions per second of background requests, closed loop at 4 in flight."""
    rng = random.Random(args.seed)
    done = 0
    deadline = time.perf_counter() + args.capacity_s

    async def worker(k: int) -> None:
        nonlocal done
        n = 0
        while time.perf_counter() < deadline:
            body = _body(model, rng, f"cap-{k}-{n}", args.words, args.background_tokens)
            n += 1
            if (await _send(client, url, body, None)).ok:
                done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(4)))
    return done / (time.perf_counter() - started)


def _summary(records: list[RequestRecord]) -> dict[str, Any]:
    ttft = [r.ttft_s for r in records if r.ok and r.ttft_s is not None]
    p50, p99 = pct(ttft, 50), pct(ttft, 99)
    return {
        "sent": len(records),
        "ok": len(ttft),
        "shed_429": sum(1 for r in records if r.status == 429),
        "failed_other": sum(1 for r in records if not r.ok and r.status != 429),
        "ttft_p50_s": None if p50 is None else round(p50, 4),
        "ttft_p99_s": None if p99 is None else round(p99, 4),
    }


async def arm_run(
    client: httpx.AsyncClient,
    urls: dict[str, str],
    model: str,
    arm: str,
    rep: int,
    cap: float,
    args: Any,
) -> dict[str, Any]:
    """One arm; `urls`: the gated gateway's ("gated") and the ungated one's ("ungated")."""
    url = urls["ungated" if arm == "ungated" else "gated"]
    n_i = max(1, round(args.interactive_rate * args.seconds))
    interactive = plan(model, arm, rep, "i", n_i, args.interactive_rate, args)
    loops = [open_loop(client, url, interactive, None)]
    rate_b = args.background_factor * cap
    if arm != "alone":
        n_b = max(1, round(rate_b * args.seconds))
        background = plan(model, arm, rep, "b", n_b, rate_b, args)
        # interactive lines say nothing (normal) in every arm; background is classed or not
        classed = arm in ("background", "ungated")
        headers = {"x-warmgate-priority": "background"} if classed else None
        loops.append(open_loop(client, url, background, headers))
    results = await asyncio.gather(*loops)
    row: dict[str, Any] = {"repeat": rep, "arm": arm, "interactive": _summary(results[0])}
    row["interactive_ttfts_s"] = [round(r.ttft_s, 4) for r in results[0] if r.ttft_s is not None]
    if arm != "alone":
        row["background"] = _summary(results[1]) | {"rate_per_s": round(rate_b, 3)}
    return row


async def run(args: argparse.Namespace) -> dict[str, Any]:
    engine_args = step_engine_args(args)
    spec = RealFleetSpec(instances=1, scheduling_policy="priority", engine_args=engine_args)
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": []}
    async with real_fleet_with_gateway(spec, GATEWAY, args.out / "logs") as (fleet, gw):
        assert gw is not None
        ungated_dir = args.out / "logs" / "ungated"
        ungated_dir.mkdir(parents=True, exist_ok=True)
        ungated = await start_gateway(GATEWAY, fleet, ungated_dir, UNGATED_ENV)
        try:
            urls = {
                "gated": f"{gw.base_url}/chat/completions",
                "ungated": f"{ungated.base_url}/chat/completions",
            }
            await _arms(urls, fleet.model, args, out)
        finally:
            await ungated.stop()
    return out


async def _arms(urls: dict[str, str], model: str, args: Any, out: dict[str, Any]) -> None:
    """The capacity, then every repeat's arms in rotated order, into `out`."""
    timeout = httpx.Timeout(300.0, connect=10.0)
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        cap = await capacity(client, urls["gated"], model, args)
        out["capacity_per_s"] = round(cap, 3)
        print(f"capacity {cap:.2f} completions/s", file=sys.stderr, flush=True)
        for rep in range(args.repeats):
            order = ARMS[rep % len(ARMS) :] + ARMS[: rep % len(ARMS)]
            for arm in order:
                row = await arm_run(client, urls, model, arm, rep, cap, args)
                out["rows"].append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)


def render(res: dict[str, Any]) -> str:
    a = res["args"]
    lines = [
        "# Interactive TTFT beside background load, real vLLM (bench.priority_real)",
        "",
        f"One vLLM engine, `--scheduling-policy priority`, behind {GATEWAY}; capacity "
        f"{res['capacity_per_s']} completions/s; interactive {a['interactive_rate']}/s for "
        f"{a['seconds']} s an arm, background at {a['background_factor']}x capacity; prompts "
        f"of {a['words']} random words, replies {a['interactive_tokens']} / "
        f"{a['background_tokens']} tokens; arms rotated each repeat; vLLM's "
        f"--max-num-batched-tokens {a.get('max_num_batched_tokens') or 'default'}, "
        f"--long-prefill-token-threshold {_flag(a.get('long_prefill_token_threshold'))}.",
        "",
        "| repeat | arm | interactive ok / sent | p50 s | p99 s | p99 / alone's | "
        "background ok / shed / sent | background p50 s |",
        "|---|---|---|---:|---:|---:|---|---:|",
    ]  # fmt: skip
    alone = {
        r["repeat"]: r["interactive"]["ttft_p99_s"] for r in res["rows"] if r["arm"] == "alone"
    }
    for r in res["rows"]:
        i, b = r["interactive"], r.get("background") or {}
        base = alone.get(r["repeat"])
        ratio = round(i["ttft_p99_s"] / base, 2) if base and i["ttft_p99_s"] else ""
        bg = f"{b['ok']} / {b['shed_429']} / {b['sent']}" if b else ""
        lines.append(
            f"| {r['repeat']} | {r['arm']} | {i['ok']} / {i['sent']} | {i['ttft_p50_s']} "
            f"| {i['ttft_p99_s']} | {ratio} | {bg} | {b.get('ttft_p50_s', '')} |"
        )
    lines += ["", *_pooled_lines(res["rows"])]
    return "\n".join(lines) + "\n"


def _pooled_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Each arm's interactive lines of every repeat in one sample, against alone's."""
    pooled: dict[str, list[float]] = {}
    for r in rows:
        pooled.setdefault(r["arm"], []).extend(r.get("interactive_ttfts_s", []))
    alone = pct(pooled.get("alone", []), 99)
    out = [
        "Pooled over the repeats (the same interactive arrivals in every arm of a repeat):",
        "",
        "| arm | lines | p50 s | p99 s | p99 / alone's |",
        "|---|---:|---:|---:|---:|",
    ]
    for arm in ARMS:
        xs = pooled.get(arm, [])
        p50, p99 = pct(xs, 50), pct(xs, 99)
        ratio = f"{p99 / alone:.2f}" if alone and p99 is not None else ""
        out.append(f"| {arm} | {len(xs)} | {_seconds(p50)} | {_seconds(p99)} | {ratio} |")
    return out


def _flag(value: str | None) -> str:
    return "default" if value in (None, "None") else value


def _seconds(v: float | None) -> str:
    return "" if v is None else f"{v:.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.priority_real", description=__doc__)
    p.add_argument("--seconds", type=float, default=60.0, help="per arm")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--interactive-rate", type=float, default=0.5, help="per second")
    p.add_argument("--background-factor", type=float, default=2.0, help="x capacity")
    p.add_argument("--capacity-s", type=float, default=20.0)
    p.add_argument("--words", type=int, default=150, help="random words a prompt")
    p.add_argument("--interactive-tokens", type=int, default=8)
    p.add_argument("--background-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=7)
    add_step_option(p)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if min(args.seconds, args.interactive_rate, args.background_factor, args.repeats) <= 0:
        p.error("--seconds, --interactive-rate, --background-factor, --repeats must be > 0")
    args.out.mkdir(parents=True, exist_ok=True)
    res = asyncio.run(run(args))
    (args.out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    md = render(res)
    (args.out / "report.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
