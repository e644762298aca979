"""Gateway overhead: the latency a gateway adds over calling an engine directly.

One simulated engine with the `zero` profile (no compute time: what is left is HTTP,
parsing and routing) serves every target in turn: the engine itself ("direct") and each
gateway in front of it. For each mode (non-streaming: latency = end to end; streaming:
latency = time to the first text chunk) and each cap on concurrent streams (64, 512: the
most requests the load generator keeps in flight, one connection each), the load generator
offers a ladder of request rates, each for `step_s` seconds (longer at low rates, so every
step has at least `MIN_REQUESTS` requests), at evenly spaced arrival times.
Latency counts from a request's scheduled arrival, so a target that cannot keep up shows
it. At each rate:

    added_p50 = p50(gateway) - p50(direct),   added_p99 = p99(gateway) - p99(direct)

At each rate the direct step runs just before the gateway's, so the two see the same
machine (others' load on it drifts). The reported `added_*_ms` are those at the lowest rate
(light load); a negative value means the difference is inside the noise. `max_rate_rps` is the
highest rate of the ladder, tried from the bottom, whose added p99 stays under 10 ms with
no errors and at least 90% of the offered rate achieved; a rung that fails is run once
more (the machine is shared, one noisy step should not end the ladder) and the ladder stops
at the first rate that fails twice. The load generator, the gateway and the engine share
this machine's cores, so the ceiling found is that of the whole box as much as of the
gateway's; the direct run, measured the same way, is the reference.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.peers import Fleet, FleetSpec, Gateway, peer_missing, start_gateway
from bench.replay import RequestRecord, send_one
from bench.report import pct

DEFAULT_RATES = (10.0, 25.0, 50.0, 100.0, 200.0)
MIN_REQUESTS = 60  # per step, so a p99 rests on at least this many samples
DEFAULT_STREAMS = (64, 512)
MODES = ("non-stream", "stream")
ADDED_P99_LIMIT_S = 0.010


@dataclass(frozen=True, slots=True)
class Step:
    """One rate step against one target."""

    rate: float
    latencies_s: list[float]
    errors: int
    achieved_rps: float

    @property
    def p50(self) -> float | None:
        return pct(self.latencies_s, 50)

    @property
    def p99(self) -> float | None:
        return pct(self.latencies_s, 99)


def _body(i: int, model: str, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": f"ping {i}: how far to the inn?"}],
        "max_tokens": 8,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def _one(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], stream: bool
) -> float | None:
    """Latency of one request (TTFT when streaming), None on failure."""
    if stream:
        rec = RequestRecord(index=0, scheduled_s=0.0)
        await send_one(client, url, body, rec, instance_by_url={})
        return rec.ttft_s if rec.ok else None
    start = time.perf_counter()
    try:
        r = await client.post(url, json=body)
        await r.aread()
    except httpx.HTTPError:
        return None
    return time.perf_counter() - start if r.status_code == 200 else None


async def run_step(
    client: httpx.AsyncClient,
    url: str,
    *,
    model: str,
    rate: float,
    streams: int,
    stream: bool,
    step_s: float,
    min_requests: int = MIN_REQUESTS,
) -> Step:
    """Offer `rate` requests/s for `step_s` seconds (or `min_requests` requests, if more)
    with at most `streams` in flight."""
    n = max(min_requests, int(rate * step_s))
    sem = asyncio.Semaphore(streams)
    lat: list[float] = []
    errors = 0
    start = time.perf_counter()

    async def go(i: int) -> None:
        nonlocal errors
        scheduled = start + i / rate
        async with sem:
            queued = time.perf_counter() - scheduled
            got = await _one(client, url, _body(i, model, stream), stream)
        if got is None:
            errors += 1
        else:
            lat.append(max(0.0, queued) + got)

    tasks = []
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(go(i)))
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    return Step(rate=rate, latencies_s=lat, errors=errors, achieved_rps=n / wall)


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000.0, 3)


async def _paired_ladder(
    gateway_url: str,
    direct_url: str,
    *,
    model: str,
    stream: bool,
    streams: int,
    rates: Sequence[float],
    step_s: float,
    api_key: str | None,
    min_requests: int,
) -> tuple[dict[float, Step], dict[float, Step]]:
    """At each rate, a step straight to the engine and then one through the gateway, so
    every comparison is made minutes apart at most; stop at the first rate the gateway
    fails. Returns (gateway steps, direct steps)."""
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    auth = {"authorization": f"Bearer {api_key}"} if api_key else None
    gw_steps: dict[float, Step] = {}
    direct_steps: dict[float, Step] = {}
    async with (
        httpx.AsyncClient(limits=limits, timeout=30.0, headers=auth) as gw,
        httpx.AsyncClient(limits=limits, timeout=30.0) as direct,
    ):
        for i in range(20):  # warm connections and first-request paths
            await _one(gw, gateway_url, _body(i, model, stream), stream)
            await _one(direct, direct_url, _body(i, model, stream), stream)
        for rate in rates:
            kw: dict[str, Any] = {
                "model": model, "rate": rate, "streams": streams, "stream": stream,
                "step_s": step_s, "min_requests": min_requests,
            }  # fmt: skip
            for _attempt in range(2):  # a rung fails only if it fails twice (shared machine)
                direct_steps[rate] = await run_step(direct, direct_url, **kw)
                gw_steps[rate] = await run_step(gw, gateway_url, **kw)
                if _passes(gw_steps[rate], direct_steps[rate]):
                    break
            if not _passes(gw_steps[rate], direct_steps[rate]):
                break
    return gw_steps, direct_steps


def _passes(step: Step, base: Step | None) -> bool:
    if base is None or step.errors or step.p99 is None or base.p99 is None:
        return False
    return step.p99 - base.p99 < ADDED_P99_LIMIT_S and step.achieved_rps >= 0.9 * step.rate


def summarize_case(
    mode: str,
    streams: int,
    steps: dict[float, Step],
    direct: dict[float, Step],
    rates_tried: Sequence[float] | None = None,
) -> dict[str, Any]:
    rates = sorted(steps)
    rates_tried = rates_tried if rates_tried is not None else rates
    low = rates[0] if rates else None
    case: dict[str, Any] = {"mode": mode, "streams": streams}
    if low is not None and direct.get(low) is not None:
        g, d = steps[low], direct[low]
        case["added_p50_ms"] = _ms(None if g.p50 is None or d.p50 is None else g.p50 - d.p50)
        case["added_p99_ms"] = _ms(None if g.p99 is None or d.p99 is None else g.p99 - d.p99)
        case["at_rate_rps"] = low
    passing = []
    for rate in rates:
        if not _passes(steps[rate], direct.get(rate)):
            break
        passing.append(rate)
    case["max_rate_rps"] = passing[-1] if passing else None
    case["max_rate_capped"] = bool(passing) and len(passing) == len(rates_tried)
    case["steps"] = [
        {
            "rate_rps": r,
            "p50_ms": _ms(steps[r].p50),
            "p99_ms": _ms(steps[r].p99),
            "direct_p99_ms": _ms(direct[r].p99) if r in direct else None,
            "errors": steps[r].errors,
            "achieved_rps": round(steps[r].achieved_rps, 1),
        }
        for r in rates
    ]
    return case


async def measure_overhead(
    gateways: Sequence[str],
    workdir: Path,
    *,
    streams: Sequence[int] = DEFAULT_STREAMS,
    rates: Sequence[float] = DEFAULT_RATES,
    step_s: float = 2.0,
    min_requests: int = MIN_REQUESTS,
    model: str = "sim-overhead",
) -> dict[str, Any]:
    """The `overhead` section of results.json for `gateways` (see the module docstring)."""
    spec = FleetSpec(instances=1, model=model, profile="zero", time_scale=1.0, tierd=False)
    fleet = Fleet(spec, workdir)
    result: dict[str, Any] = {
        "method": (
            f"One `zero`-profile engine; rates {list(rates)} req/s offered for {step_s:g} s "
            f"each (at least {min_requests} requests a step) with at most {list(streams)} "
            "concurrent streams (the load generator's cap, one connection each), "
            "latency from scheduled arrival (TTFT when streaming, end to end otherwise); "
            "added = gateway percentile - direct percentile at the same rate, the direct "
            "step run just before the gateway's; max rate = "
            "highest rate, from the bottom, with added p99 < 10 ms, no errors and >= 90% of "
            "the offered rate achieved (a failing rung is retried once). Load generator, gateway "
            "and engine share the "
            "machine's cores."
        ),
        "gateways": {},
    }
    try:
        await fleet.start()
        engine_url = fleet.engines["e0"] + "/v1/chat/completions"
        for name in gateways:
            missing = peer_missing(name)
            if missing:
                result["gateways"][name] = {"skipped": missing}
                continue
            gw: Gateway | None = None
            try:
                gw = await start_gateway(name, fleet, workdir)
                cases = []
                for mode in MODES:
                    for cap in streams:
                        steps, direct = await _paired_ladder(
                            gw.base_url + "/chat/completions", engine_url, model=model,
                            stream=mode == "stream", streams=cap, rates=rates, step_s=step_s,
                            api_key=gw.api_key, min_requests=min_requests,
                        )  # fmt: skip
                        cases.append(summarize_case(mode, cap, steps, direct, rates))
                result["gateways"][name] = {"cases": cases}
            except (RuntimeError, TimeoutError) as exc:
                result["gateways"][name] = {"skipped": f"failed to run: {exc}"[:500]}
            finally:
                if gw is not None:
                    await gw.stop()
    finally:
        await fleet.stop()
    return result
