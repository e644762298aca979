"""One chaos row (`run_row`): a fault injected under a bounded game load, recovered, and what
the client and the fleet saw; the rows as a Markdown table (`markdown`). The simulated-fleet
CLI (bench/chaos.py) and the real-vLLM one (bench/chaos_real.py) both run rows through it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from bench.chaos_faults import DiskFull, Fault
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


async def _continued_by(urls: list[str], client: httpx.AsyncClient) -> dict[str, int]:
    """Streams continued, by mode (token_ids, text), from the gateways' own counters."""
    by: Counter[str] = Counter()
    for url in urls:
        with contextlib.suppress(httpx.HTTPError):
            text = (await client.get(f"{url}/metrics", timeout=2)).text
            for line in text.splitlines():
                if line.startswith('warmgate_continuation_total{mode="'):
                    mode = line.split('"')[1]
                    by[mode] += int(float(line.rsplit(" ", 1)[1]))
    return dict(by)


async def _reference(client: httpx.AsyncClient, engine_url: str, body: dict[str, Any]) -> list[str]:
    """The engine's own streamed answer to `body`, one text piece a token."""
    pieces: list[str] = []
    req = {**body, "stream": True, "return_token_ids": True}
    async with client.stream("POST", f"{engine_url}/v1/chat/completions", json=req) as r:
        if r.status_code != 200:
            return []
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                ids = choice.get("token_ids") or []
                text = (choice.get("delta") or {}).get("content") or ""
                pieces.extend([text] + [""] * (len(ids) - 1) if ids else [])
    return pieces


async def continued_diffs(results: list[Any], engine_url: str) -> list[dict[str, Any]]:
    """Where each continued answer that is not the engine's own uninterrupted one departs
    from it: the token (of the engine's answer) and the text around it."""
    out: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=300) as client:
        for res in results:
            if not (res.continued and res.status == 200 and res.body):
                continue
            pieces = await _reference(client, engine_url, res.body)
            want = "".join(pieces)
            if not pieces or want == res.text:
                continue
            at = next(
                (i for i, (a, b) in enumerate(zip(want, res.text, strict=False)) if a != b),
                min(len(want), len(res.text)),
            )
            token, upto = 0, 0
            while token < len(pieces) and upto + len(pieces[token]) <= at:
                upto += len(pieces[token])
                token += 1
            out.append(
                {
                    "token": token,
                    "tokens": len(pieces),
                    "char": at,
                    # cut again later (the error event), its text a prefix of the engine's
                    "failed_mid_stream": res.failed_mid_stream,
                    "prefix": want.startswith(res.text),
                    "got": res.text[max(0, at - 30) : at + 30],
                    "want": want[max(0, at - 30) : at + 30],
                }
            )
    return out


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
            continued_by = await _continued_by(fleet.gateway_urls, client)
            after = await _tierd_slices(fleet, client) if fleet.tierds else None
        healthy = fleet.engine_urls[-1]
        verified = await load.verify(healthy, sample=args.verify)
        continued_checked, continued_same = await load.continued_identical(healthy)
        diffs = (
            await continued_diffs(results, healthy) if continued_same < continued_checked else []
        )
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
        "continued_by": continued_by,
        "continued_then_failed": sum(r.continued and r.failed_mid_stream for r in results),
        "continued_diffs": diffs,
        "time_to_detect_s": detect,
        "time_to_recover_s": recover,
        "wrong_answers": sum(r.wrong is not None for r in results),
        "answers_verified": verified,
        "data_lost": len(silent) + lost_slices,
        "tierd_slices": {"before": before, "after": after} if before else None,
        "client_shed": load.shed,
        "errors": dict(errors.most_common(5)),
    }


def _continued(row: dict[str, Any]) -> str:
    same = row.get("continued_identical_to_uninterrupted")
    if not (row["continued"] and same):
        return str(row["continued"])
    by = row.get("continued_by") or {}
    notes = [f"{n} by {m.replace('_', ' ')}" for m, n in sorted(by.items())]
    if row.get("continued_then_failed"):
        notes.append(f"{row['continued_then_failed']} cut again later")
    return f"{row['continued']} ({same} identical{''.join('; ' + n for n in notes)})"


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
