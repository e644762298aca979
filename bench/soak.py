"""`warmgate bench soak`: a long run at a steady share of measured capacity, watching the
gateway for leaks. On loopback: simulated engines, one gateway; the load is the game load of
`bench.loadgen` (streamed chat, sessions, growing histories).

1. warm up, then measure capacity: completed requests per second with `--concurrency`
   clients always waiting (`--capacity-s`); the load comes from `--clients` processes
   (`bench.load_procs`), for capacity and soak alike;
2. run Poisson arrivals at `--share` of it for `--warmup-min` (one prefix-index TTL by
   default: the index fills to its steady state, reported apart), then for `--minutes`,
   measured, sampling the gateway every `--sample-s`: RSS and open descriptors (/proc),
   asyncio tasks (its `warmgate_event_loop_tasks`), the prefix index's entries
   (`/admin/stats`);
3. report: RSS growth over the measured minutes (and from the end of their first window,
   and from the warm-up's start), the rate offered against the rate asked and how late the
   arrivals started,
   descriptors and tasks first vs last, index entries against their bound, TTFT p50/p99 of
   the first and last windows (`--window-min`), failures.

`--overload` is a short, bounded run past capacity instead (`OVERLOAD`: 3 minutes measured
at 1.2x the closed loop after half a minute's warm-up, about 5 minutes in all) for the GC
share of the gateway's CPU: its `warmgate_gc_pause_seconds` over its CPU seconds, by
generation, over the measured minutes and per row of the series.

JSON to `--json`, a Markdown table beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.load_procs import LoadProcesses
from bench.loadgen import Result, percentile
from bench.sim_fleet import SimFleet, proc_sample
from bench.soak_series import (
    ENGINE_TTFT,
    GATEWAY_GC,
    GATEWAY_GC_CPU,
    GATEWAY_TTFT,
    gc_share,
    histogram_sums_by,
    histogram_totals,
    machine_busy_s,
    samples_by,
    series,
)

# `--overload`: past capacity, short; every value can still be given on the command line
OVERLOAD = {
    "minutes": 3.0, "share": 1.2, "warmup_min": 0.5, "capacity_s": 30.0,
    "sample_s": 10.0, "series_s": 30.0, "window_min": 1.0,
}  # fmt: skip


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="warmgate bench soak", description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True, help="write the results here")
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--share", type=float, default=0.8, help="of measured capacity")
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--time-scale", type=float, default=0.05)
    p.add_argument("--players", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--capacity-s", type=float, default=45.0)
    p.add_argument("--sample-s", type=float, default=15.0)
    p.add_argument("--window-min", type=float, default=5.0)
    p.add_argument(
        "--series-s", type=float, default=60.0,
        help="one row of the over-time series (TTFT at client, gateway and engines; CPU of "
        "each part; the client's GC pauses) per this many seconds",
    )  # fmt: skip
    p.add_argument(
        "--warmup-min", type=float, default=10.0,
        help="at the soak rate before the measured minutes, sampled and reported apart: one "
        "prefix-index TTL (routing.index_ttl_s, 600 s), the time the index takes to reach "
        "its steady state",
    )  # fmt: skip
    p.add_argument(
        "--clients", type=int, default=1,
        help="load-generator processes, for capacity and soak alike (bench.load_procs)",
    )  # fmt: skip
    p.add_argument("--run-dir", default=None)
    p.add_argument(
        "--trace-memory", type=float, default=0.0, metavar="S",
        help="diagnostic: run the gateway under tracemalloc (bench.memtrace), a snapshot "
        "every S s; the growth sites go into the JSON (slows the gateway: not a soak figure)",
    )  # fmt: skip
    p.add_argument(
        "--gc-watch", type=float, default=0.0, metavar="S",
        help="diagnostic: run the gateway under bench.soak_gcwatch, a line every S s (its "
        "collections, pauses and heap by generation and type) into the JSON's gc_watch",
    )  # fmt: skip
    p.add_argument(
        "--overload", action="store_true",
        help="a short run past capacity for the GC share of the gateway's CPU: "
        + ", ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in OVERLOAD.items())
        + " unless given",
    )  # fmt: skip
    if p.parse_args(list(argv)).overload:
        p.set_defaults(**OVERLOAD)
    return p.parse_args(list(argv))


async def _sample(fleet: SimFleet, client: httpx.AsyncClient) -> dict[str, Any]:
    base = fleet.gateway_urls[0]
    out: dict[str, Any] = {"t": time.monotonic(), **proc_sample(fleet.gateways[0].pid)}
    out["machine_busy_s"] = machine_busy_s()
    out["engines_cpu_s"] = sum(proc_sample(e.pid)["cpu_s"] for e in fleet.engines)
    metrics = (await client.get(f"{base}/metrics")).text
    for line in metrics.splitlines():
        if line.startswith("warmgate_event_loop_tasks "):
            out["tasks"] = float(line.split()[1])
    out["gateway_ttft_sum"], out["gateway_ttft_count"] = histogram_totals(metrics, GATEWAY_TTFT)
    out["gateway_gc_s"] = histogram_totals(metrics, GATEWAY_GC)[0]
    out["gateway_gc_by_generation_s"] = histogram_sums_by(metrics, GATEWAY_GC, "generation")
    gc_cpu = samples_by(metrics, GATEWAY_GC_CPU, "generation")
    if gc_cpu:  # a gateway from before the counter has pauses only
        out["gateway_gc_cpu_s"] = sum(gc_cpu.values())
        out["gateway_gc_cpu_by_generation_s"] = gc_cpu
    engine_sum = engine_count = 0.0
    for url in fleet.engine_urls:
        s, c = histogram_totals((await client.get(f"{url}/metrics")).text, ENGINE_TTFT)
        engine_sum, engine_count = engine_sum + s, engine_count + c
    out["engine_ttft_sum"], out["engine_ttft_count"] = engine_sum, engine_count
    index = (await client.get(f"{base}/admin/stats")).json()["router"]["index"]
    out["index_entries"] = index["entries"]
    out["index_distinct_blocks"] = index["distinct_blocks"]
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _window(results: list[Result], t0: float, t1: float) -> dict[str, Any]:
    rs = [r for r in results if t0 <= r.started < t1]
    ttft = [r.ttft_s for r in rs if r.ttft_s is not None]
    return {
        "requests": len(rs),
        "failed": sum(r.status != 200 or r.failed_mid_stream for r in rs),
        "ttft_p50_s": _round(percentile(ttft, 50)),
        "ttft_p99_s": _round(percentile(ttft, 99)),
    }


def _gc(at_start: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """The gateway's collections over the measured minutes: pause seconds, by generation,
    and their share of its CPU seconds."""

    def by_generation(key: str) -> dict[str, float]:
        a, b = at_start.get(key, {}), last.get(key, {})
        return {g: round(b[g] - a.get(g, 0.0), 3) for g in sorted(b)}

    gc_cpu = "gateway_gc_cpu_s"
    return {
        "pause_s": round(last["gateway_gc_s"] - at_start["gateway_gc_s"], 3),
        "gc_cpu_s": round(last[gc_cpu] - at_start[gc_cpu], 3) if gc_cpu in last else None,
        "cpu_s": round(last["cpu_s"] - at_start["cpu_s"], 3),
        "share_of_gateway_cpu": gc_share(at_start, last),
        "cpu_share_of_gateway_cpu": gc_share(at_start, last, gc_cpu),
        "pause_s_by_generation": by_generation("gateway_gc_by_generation_s"),
        "gc_cpu_s_by_generation": by_generation("gateway_gc_cpu_by_generation_s"),
    }


def _rss_mb(sample: dict[str, Any]) -> float:
    return round(float(sample["rss_bytes"]) / 2**20, 1)


def _growth_pct(base: dict[str, Any], last: dict[str, Any]) -> float:
    return round(100 * (float(last["rss_bytes"]) / float(base["rss_bytes"]) - 1), 2)


async def soak(args: argparse.Namespace, fleet: SimFleet) -> dict[str, Any]:
    base = fleet.gateway_urls[0]
    load = LoadProcesses(
        [base], processes=args.clients, players=args.players, max_tokens=args.max_tokens
    )
    try:
        return await _soak(args, fleet, load)
    finally:
        load.close()


async def _soak(args: argparse.Namespace, fleet: SimFleet, load: LoadProcesses) -> dict[str, Any]:
    samples: list[dict[str, Any]] = []
    missed: list[str] = []
    async with httpx.AsyncClient(timeout=10) as client:
        await load.run(rate=5.0, duration_s=10.0)  # warm: connections, the index, the JIT-less
        capacity = await load.closed_loop(args.concurrency, args.capacity_s)
        rate = args.share * capacity
        print(f"capacity {capacity:.1f} req/s; soaking at {rate:.1f} req/s", flush=True)
        stop = asyncio.Event()

        async def sampler() -> None:
            while True:
                try:
                    samples.append(await _sample(fleet, client))
                except httpx.HTTPError as exc:  # a slow answer is a missed sample, not the end
                    missed.append(f"{time.monotonic() - warm_started:.0f} s: {exc!r}")
                if stop.is_set():
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), args.sample_s)

        warm_started = time.monotonic()
        task = asyncio.create_task(sampler())
        warm = None
        if args.warmup_min > 0:  # the index fills to the steady state its TTL defines
            warm = await load.run(rate=rate, duration_s=args.warmup_min * 60)
        at_start = await _sample(fleet, client)
        started = time.monotonic()
        soaked = await load.run(rate=rate, duration_s=args.minutes * 60)
        ended = time.monotonic()
        stop.set()
        await task
    win = args.window_min * 60
    measured = [at_start, *(s for s in samples if s["t"] > started)]
    first = [s for s in measured if s["t"] <= started + win]
    after_first = first[-1]
    last = samples[-1]
    results = soaked.results
    first_w = _window(results, started, started + win)
    last_w = _window(results, ended - win, ended + 1)
    p99_first, p99_last = first_w["ttft_p99_s"], last_w["ttft_p99_s"]
    settings_capacity = 1_000_000 * args.instances  # routing.index_capacity_blocks default
    lag = soaked.lag
    return {
        "minutes": args.minutes,
        "warmup_minutes": args.warmup_min,
        "clients": args.clients,
        "capacity_rps": round(capacity, 2),
        "rate_rps": round(rate, 2),
        "offered_rps": round(len(lag) / (args.minutes * 60), 2),
        "load_wall_min": round((ended - started) / 60, 2),
        "schedule_lag_s": {"p50": _round(percentile(lag, 50)), "p99": _round(percentile(lag, 99)),
                           "max": _round(max(lag, default=0.0))},
        "requests": len(results),
        "shed_by_client_cap": soaked.shed,
        "failed": sum(r.status != 200 or r.failed_mid_stream for r in results),
        "failures": dict(Counter(
            f"{r.error} ({'mid-stream' if r.failed_mid_stream else 'before the first byte'})"
            for r in results if r.error
        ).most_common(10)),
        "warmup": None if warm is None else {
            "requests": len(warm.results),
            "failed": sum(r.status != 200 or r.failed_mid_stream for r in warm.results),
            "rss_growth_pct": _growth_pct(samples[0], at_start),
        },
        # how hard the gateway worked: the share of one core it used over the measured minutes
        "gateway_cpu_share": round(
            (last["cpu_s"] - at_start["cpu_s"]) / (last["t"] - at_start["t"]), 3
        ),
        "gateway_gc": _gc(at_start, last),
        "rss_warmup_start_mb": _rss_mb(samples[0]),
        "rss_start_mb": _rss_mb(at_start),
        "rss_after_first_window_mb": _rss_mb(after_first),
        "rss_end_mb": _rss_mb(last),
        "rss_growth_pct": _growth_pct(at_start, last),
        "rss_growth_after_first_window_pct": _growth_pct(after_first, last),
        "rss_growth_from_warmup_start_pct": _growth_pct(samples[0], last),
        "fds": {"start": at_start["fds"], "end": last["fds"],
                "max": max(s["fds"] for s in measured)},
        "tasks": {"start": at_start.get("tasks"), "end": last.get("tasks"),
                  "max": max(s.get("tasks", 0) for s in measured)},
        "index_entries": {"start": at_start["index_entries"], "end": last["index_entries"],
                          "max": max(s["index_entries"] for s in measured),
                          "bound": settings_capacity},
        "first_window": first_w,
        "last_window": last_w,
        "ttft_p99_last_vs_first_pct": None
        if not (p99_first and p99_last)
        else round(100 * (p99_last / p99_first - 1), 1),
        "samples_missed": missed,
        # over time, warm-up included (t_min from its start): where a drift comes from
        "series": series(
            samples,
            [*(warm.results if warm else []), *results],
            gc_pauses=[*(warm.gc_pauses if warm else []), *soaked.gc_pauses],
            client_cpu=[*(warm.client_cpu if warm else []), *soaked.client_cpu],
            every_s=args.series_s,
        ),
        "samples": samples,
    }  # fmt: skip


def memory_trace(path: Path) -> dict[str, Any]:
    """The series (traced MB, live objects, gc) and the last snapshot's growth sites."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    series = [{k: r[k] for k in r if k != "growth"} for r in rows]
    return {
        "series": series,
        "growth_last": rows[-1].get("growth", []) if rows else [],
    }


def markdown(r: dict[str, Any]) -> str:
    lag = r["schedule_lag_s"]
    warm = r["warmup"]
    gcs = r["gateway_gc"]
    rows = [
        ("capacity (closed loop) / soak rate asked / offered, req/s",
         f"{r['capacity_rps']} / {r['rate_rps']} / {r['offered_rps']}"),
        ("load generator: processes / schedule lag p50 / p99 / max, s",
         f"{r['clients']} / {lag['p50']} / {lag['p99']} / {lag['max']}"),
        ("minutes measured / wall time of the load", f"{r['minutes']} / {r['load_wall_min']}"),
        ("gateway CPU over the measured minutes, share of one core", r["gateway_cpu_share"]),
        ("**GC share of gateway CPU**: pauses (pause s / gateway CPU s; by generation)",
         f"{gcs['share_of_gateway_cpu']} ({gcs['pause_s']} / {gcs['cpu_s']}; "
         + " / ".join(str(v) for v in gcs["pause_s_by_generation"].values()) + ")"),
        ("GC share of gateway CPU: the collections' CPU (GC CPU s; by generation)",
         f"{gcs.get('cpu_share_of_gateway_cpu')} ({gcs.get('gc_cpu_s')}; "
         + " / ".join(str(v) for v in gcs.get("gc_cpu_s_by_generation", {}).values()) + ")"),
        ("warm-up before: minutes / requests / failed / RSS growth",
         "none" if warm is None else
         f"{r['warmup_minutes']} / {warm['requests']} / {warm['failed']} / "
         f"{warm['rss_growth_pct']}%"),
        ("requests / failed / shed by the client's cap",
         f"{r['requests']} / {r['failed']} / {r['shed_by_client_cap']}"),
        ("RSS warm-up start / start / after first window / end, MB",
         f"{r['rss_warmup_start_mb']} / {r['rss_start_mb']} / "
         f"{r['rss_after_first_window_mb']} / {r['rss_end_mb']}"),
        ("RSS growth from start / after first window / from warm-up start",
         f"{r['rss_growth_pct']}% / {r['rss_growth_after_first_window_pct']}% / "
         f"{r['rss_growth_from_warmup_start_pct']}%"),
        ("fds start / end / max", f"{r['fds']['start']} / {r['fds']['end']} / {r['fds']['max']}"),
        ("asyncio tasks start / end / max",
         f"{r['tasks']['start']} / {r['tasks']['end']} / {r['tasks']['max']}"),
        ("index entries start / end / max / bound",
         f"{r['index_entries']['start']} / {r['index_entries']['end']} / "
         f"{r['index_entries']['max']} / {r['index_entries']['bound']}"),
        ("TTFT p50 first / last window, s",
         f"{r['first_window']['ttft_p50_s']} / {r['last_window']['ttft_p50_s']}"),
        ("TTFT p99 first / last window, s",
         f"{r['first_window']['ttft_p99_s']} / {r['last_window']['ttft_p99_s']} "
         f"({r['ttft_p99_last_vs_first_pct']}%)"),
    ]  # fmt: skip
    lines = [f"# soak, {r['minutes']} min", "", "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    lines += [
        "", "## over time, warm-up included (TTFT in s, CPU in cores)", "",
        "| min | requests | client TTFT p50 / p99 | gateway / engines TTFT mean "
        "| CPU gateway / engines / load / machine "
        "| gateway GC pauses s / their share of its CPU / GC CPU share "
        "| load GC pauses total / max / full |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    lines += [
        f"| {x['t_min']} | {x['requests']} | {x['client_ttft_p50_s']} / "
        f"{x['client_ttft_p99_s']} | {x['gateway_ttft_mean_s']} / {x['engine_ttft_mean_s']} "
        f"| {x['gateway_cpu']} / {x['engines_cpu']} / {x['client_cpu']} / {x['machine_cpu']} "
        f"| {x['gateway_gc_pause_s']} / {x.get('gateway_gc_share')} / "
        f"{x.get('gateway_gc_cpu_share')} "
        f"| {x['client_gc_pause_s']} / {x['client_gc_max_s']} / {x['client_gc_full']} |"
        for x in r.get("series", [])
    ]
    return "\n".join(lines) + "\n"


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    out = Path(args.json)
    run_dir = (
        Path(args.run_dir) if args.run_dir else out.with_suffix("").with_name(out.stem + "-run")
    )
    fleet = SimFleet(run_dir, instances=args.instances, time_scale=args.time_scale)
    trace = run_dir / "memtrace.jsonl"
    if args.trace_memory:
        trace.unlink(missing_ok=True)
        fleet.gateway_launcher = ("-m", "bench.memtrace", str(trace), str(args.trace_memory))
    watch = run_dir / "gcwatch.jsonl"
    if args.gc_watch:
        watch.unlink(missing_ok=True)
        fleet.gateway_launcher = ("-m", "bench.soak_gcwatch", str(watch), str(args.gc_watch))
    # SIGTERM ends the run as Ctrl-C does: the fleet (its own process groups) stops on the way
    # out instead of serving on after its soak is gone
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        fleet.start()
        result = asyncio.run(soak(args, fleet))
    finally:
        fleet.stop()
    if args.trace_memory:
        result["memory_trace"] = memory_trace(trace)
    if args.gc_watch and watch.exists():
        result["gc_watch"] = [json.loads(x) for x in watch.read_text().splitlines() if x.strip()]
    out.write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0
