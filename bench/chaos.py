"""`warmgate bench chaos --json OUT`: each fault injected under a bounded game load on a
fresh simulated fleet, then recovered; one row per fault.

Timeline of a row: load starts; the fault at `--fault-at` s; recovery at `--recover-at` s
(so SIGSTOP lasts 20 s by default); load ends `--tail` s later. Faults: engine SIGKILL
(restarted), engine SIGSTOP (SIGCONT), a slow engine (stopped 75% of the time), tierd
SIGKILL (restarted), Redis SIGKILL (restarted), Redis SIGSTOP, the array disk full (a
tmpfs filled, then emptied; root only), a gateway replica SIGKILL with a second replica
behind a client that retries on it (restarted).

Per row: requests; failed before the first byte and mid-stream (as the client saw them,
after its retry where it has one); streams continued; time to detect (the fault visible
where it should be: the instance unhealthy in the gateway, its `/readyz` shared state down,
tierd `/readyz` degraded, the gateway's prefetch hints to tierd failing, the gateway
replica refusing connections); time to recover (after
the recovery action, until that clears); wrong answers (`bench.loadgen`: malformed, or a
text the engine does not give to the same prompt); data lost (answers cut without an error
event, plus KV slices tierd held before the fault and lost or corrupt after it). The faults
themselves, their injection, recovery and probes: bench/chaos_faults.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.chaos_faults import DiskFull, Fault, faults
from bench.loadgen import Load
from bench.sim_fleet import SimFleet

GATEWAY = {
    "health": {"interval_s": 0.5, "timeout_s": 0.5, "failure_threshold": 2},
    "timeouts": {"first_byte_s": 5.0, "stall_s": 2.0},
    "routing": {"policy": "ttft"},
}


async def _first_true(
    check: Callable[[], Awaitable[bool]], since: float, until: float
) -> float | None:
    while time.monotonic() < until:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            if await check():
                return round(time.monotonic() - since, 3)
        await asyncio.sleep(0.1)
    return None


async def _tierd_slices(fleet: SimFleet, client: httpx.AsyncClient) -> dict[str, int]:
    s = (await client.get(f"{fleet.tierd_urls[0]}/v1/stats", timeout=2)).json()
    return {
        "array": int(s["tiers"]["array"]["slices"]),
        "recovered": int(s.get("recovered", {}).get("array", 0)),
        "corrupt": int(sum(s.get("corrupt", {}).values())),
    }


async def run_row(
    fault: Fault, extra: Any, args: argparse.Namespace, run_dir: Path, fleet: Any = None
) -> dict[str, Any]:
    needs = dict(fault.needs)
    fleet = fleet or SimFleet(
        run_dir,
        instances=args.instances,
        time_scale=args.time_scale,
        tierd=bool(needs.get("tierd")),
        redis=bool(needs.get("redis")),
        replicas=int(needs.get("replicas", 1)),
        gateway_settings=GATEWAY,
        engine_args=("--kv-capacity-tokens", "20000"),
    )
    if needs.get("tierd") and isinstance(fleet, SimFleet):
        fleet.tierd_args = ("--l1-bytes", str(4 * 262144))
    if isinstance(extra, DiskFull):
        extra.prepare(fleet)
    try:
        await asyncio.to_thread(fleet.start)
        load = Load(
            fleet.gateway_urls,
            players=args.players,
            max_tokens=args.max_tokens,
            retry_other=len(fleet.gateway_urls) > 1,
            model=fleet.model,
            body_extra=fleet.body_extra,
        )
        async with httpx.AsyncClient(timeout=2.0) as client:
            t_start = time.monotonic()
            run = asyncio.create_task(load.run(args.rate, args.recover_at + args.tail))
            await asyncio.sleep(args.fault_at)
            before = await _tierd_slices(fleet, client) if fleet.tierds else None
            fault_t = time.monotonic()
            await fault.inject(fleet)
            recover_t = t_start + args.recover_at
            detect = await _first_true(lambda: fault.detected(fleet, client), fault_t, recover_t)
            await asyncio.sleep(max(0.0, recover_t - time.monotonic()))
            recover_t = time.monotonic()
            await fault.recover(fleet)
            recover = await _first_true(
                lambda: fault.cleared(fleet, client), recover_t, recover_t + args.recover_window
            )
            await run
            results = load.recorded()
            after = await _tierd_slices(fleet, client) if fleet.tierds else None
        healthy = fleet.engine_urls[-1]
        verified = await load.verify(healthy, sample=args.verify)
        continued_checked, continued_same = await load.continued_identical(healthy)
        await load.aclose()
    finally:
        await asyncio.to_thread(fleet.stop)
        if isinstance(extra, DiskFull):
            extra.cleanup(fleet)
    failed_before = [r for r in results if r.failed_before_first_byte]
    failed_mid = [r for r in results if r.failed_mid_stream]
    silent = [r for r in results if r.error == "no [DONE]"]
    lost_slices = 0
    if before is not None and after is not None and fault.name == "tierd SIGKILL":
        lost_slices = max(0, before["array"] - after["recovered"]) + after["corrupt"]
    errors = Counter(r.error for r in results if r.error)
    return {
        "fault": fault.name,
        "requests": len(results),
        "failed_before_first_byte": len(failed_before),
        "failed_mid_stream": len(failed_mid),
        "continued": sum(r.continued for r in results),
        "continued_identical_to_uninterrupted": f"{continued_same} of {continued_checked}",
        "time_to_detect_s": detect,
        "time_to_recover_s": recover,
        "wrong_answers": sum(r.wrong is not None for r in results),
        "answers_verified": verified,
        "data_lost": len(silent) + lost_slices,
        "tierd_slices": {"before": before, "after": after} if before else None,
        "client_shed": load.shed,
        "errors": dict(errors.most_common(5)),
    }


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="warmgate bench chaos", description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True)
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--time-scale", type=float, default=0.3)
    p.add_argument("--rate", type=float, default=10.0, help="requests per second")
    p.add_argument("--players", type=int, default=60)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--fault-at", type=float, default=8.0)
    p.add_argument("--recover-at", type=float, default=28.0)
    p.add_argument("--tail", type=float, default=8.0)
    p.add_argument("--verify", type=int, default=150, help="answers re-asked of an engine")
    p.add_argument("--only", action="append", help="run only faults whose name has this")
    p.add_argument("--run-dir", default=None)
    p.add_argument("--engines", choices=("sim", "vllm"), default="sim", help="bench.chaos_real")
    p.add_argument("--recover-window", type=float, default=60.0, help="s to wait for recovery")
    return p.parse_args(list(argv))


def _continued(row: dict[str, Any]) -> str:
    same = row.get("continued_identical_to_uninterrupted")
    return (
        f"{row['continued']} ({same} identical)"
        if row["continued"] and same
        else str(row["continued"])
    )


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| fault | requests | failed before first byte | failed mid-stream | continued | "
        "detect s | recover s | wrong answers | data lost |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['fault']} | skipped: {r['skipped']} ||||||||")
            continue
        lines.append(
            f"| {r['fault']} | {r['requests']} | {r['failed_before_first_byte']} | "
            f"{r['failed_mid_stream']} | {_continued(r)} | {r['time_to_detect_s']} | "
            f"{r['time_to_recover_s']} | {r['wrong_answers']} | {r['data_lost']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    out = Path(args.json)
    base = Path(args.run_dir) if args.run_dir else out.with_name(out.stem + "-run")
    if args.engines == "vllm":
        from bench.chaos_real import main as real_main

        return real_main(args, out, base)
    rows: list[dict[str, Any]] = []
    for i, (fault, extra) in enumerate(faults()):
        if args.only and not any(o.lower() in fault.name.lower() for o in args.only):
            continue
        if isinstance(extra, DiskFull) and os.geteuid() != 0:
            rows.append({"fault": fault.name, "skipped": "needs root to mount a tmpfs"})
            continue
        if fault.needs.get("redis") and shutil.which("redis-server") is None:
            rows.append({"fault": fault.name, "skipped": "redis-server not installed"})
            continue
        row_dir = base / f"{i}-{fault.name.split()[0].lower()}-{fault.name.split()[1].lower()}"
        print(f"chaos: {fault.name} ...", flush=True)
        row = asyncio.run(run_row(fault, extra, args, row_dir))
        print(json.dumps({k: v for k, v in row.items() if k != "errors"}), flush=True)
        rows.append(row)
    result = {"settings": vars(args), "gateway": GATEWAY, "rows": rows}
    out.write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(rows))
    print(markdown(rows))
    return 0
