"""Turn replay records into the numbers of a comparison, and write `report.md`.

`summarize` reduces one gateway's run to the fields of `results.json`: TTFT p50/p90/p99,
time per output token and end-to-end p50, errors, the cached-token ratio (from each
response's `usage.prompt_tokens_details.cached_tokens`; from the engines' prefix-cache
counters when the gateway drops usage), the share of cached tokens by tier (engine
counters), load imbalance (max / mean requests per instance, from the engines' own
request counters, so a gateway cannot hide where it sent work) and throughput.

Latencies are wall seconds measured by the client divided by the engines' time scale, so
they read as the modelled hardware would serve them (the scale is written beside them).
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.compare_repeats import repeats_markdown
from bench.engine_metrics import EngineDelta
from bench.replay import RequestRecord
from bench.tier_stats import TIERS_NOTE, tiers_table


def pct(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) of `values`, None when there are none."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def prediction_accuracy(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """How often the gateway's predicted cached tokens equal the engine's reported ones,
    over the answered requests that carry both (a gateway that predicts nothing: None)."""
    both = [
        r for r in records if r.ok and r.predicted_cached_tokens is not None
        and r.cached_tokens is not None
    ]  # fmt: skip
    if not both:
        return {"prediction_exact_share": None, "prediction_requests": 0}
    diff = [(r.predicted_cached_tokens or 0) - (r.cached_tokens or 0) for r in both]
    return {
        "prediction_exact_share": round(sum(d == 0 for d in diff) / len(both), 4),
        "prediction_requests": len(both),
        "prediction_over": sum(d > 0 for d in diff),  # predicted more than the engine had
        "prediction_under": sum(d < 0 for d in diff),
        "prediction_mean_abs_error_tokens": round(float(np.mean(np.abs(diff))), 1),
        "predicted_cached_tokens": sum(r.predicted_cached_tokens or 0 for r in both),
        "reported_cached_tokens": sum(r.cached_tokens or 0 for r in both),
    }


def summarize(
    records: Sequence[RequestRecord],
    engines: Mapping[str, EngineDelta] | None,
    *,
    time_scale: float = 1.0,
    duration_s: float | None = None,
) -> dict[str, Any]:
    """The comparison fields for one gateway's run (see the module docstring); requests
    never sent (a replay's time budget ran out) are left out."""
    records = [r for r in records if r.sent]
    ok = [r for r in records if r.ok]
    k = 1.0 / time_scale
    ttft = [r.ttft_s * k for r in ok if r.ttft_s is not None]
    tpot = [t * k for r in ok if (t := r.tpot_s) is not None]
    e2e = [r.e2e_s * k for r in ok if r.e2e_s is not None]
    gaps = [g * k for r in ok for g in r.gaps_s]
    prompt = sum(r.prompt_tokens for r in ok)
    reported = [r for r in ok if r.cached_tokens is not None]
    usage_ratio = (
        sum(r.cached_tokens or 0 for r in reported) / max(1, sum(r.prompt_tokens for r in reported))
        if reported
        else None
    )
    by_header: dict[str, int] = {}
    for r in ok:
        if r.instance:
            by_header[r.instance] = by_header.get(r.instance, 0) + 1
    engine_requests = {i: d.requests for i, d in (engines or {}).items()}
    counts: Mapping[str, float] = (
        engine_requests if sum(engine_requests.values()) > 0 else by_header
    )
    imbalance = (
        max(counts.values()) / (sum(counts.values()) / len(counts))
        if counts and sum(counts.values()) > 0
        else None
    )
    queries = sum(d.queries for d in (engines or {}).values())
    hits = sum(d.cached for d in (engines or {}).values())
    engine_ratio = hits / queries if queries > 0 else None
    tiers: dict[str, float] = {}
    for d in (engines or {}).values():
        for tier, v in d.hits_by_tier.items():
            tiers[tier] = tiers.get(tier, 0.0) + v
    by_tier = {t: round(v / queries, 4) for t, v in sorted(tiers.items())} if queries else {}
    completion = sum(r.completion_tokens for r in ok)
    wall = duration_s * k if duration_s else None
    e_sum = sum(d.ttft_sum for d in (engines or {}).values())
    e_count = sum(d.ttft_count for d in (engines or {}).values())
    engine_ttft = e_sum / e_count * k if e_count else None
    mean_ttft = float(np.mean(ttft)) if ttft else None
    # against the engines' TTFT, the client's first token (text or not) of every answer that
    # had one: what the engines counted, not the first text of the answers that printed some
    first = [r.first_token_s * k for r in records if r.first_token_s is not None]
    mean_first = float(np.mean(first)) if first else None
    return {
        "requests": len(records),
        "requests_ok": len(ok),
        "errors": len(records) - len(ok),
        "ttft_p50_s": _r(pct(ttft, 50)),
        "ttft_p90_s": _r(pct(ttft, 90)),
        "ttft_p99_s": _r(pct(ttft, 99)),
        "ttft_mean_s": _r(mean_ttft),
        # the engines' own TTFT (arrival at the engine -> first token) and what is left of
        # the client's time to its first token: the gateway, the network and the client's
        # own overhead
        "engine_ttft_mean_s": _r(engine_ttft),
        "first_token_mean_s": _r(mean_first),
        "outside_engine_ttft_mean_s": _r(
            mean_first - engine_ttft if mean_first is not None and engine_ttft is not None else None
        ),
        "tpot_p50_s": _r(pct(tpot, 50), 5),
        "itl_p99_s": _r(pct(gaps, 99), 5),
        "e2e_p50_s": _r(pct(e2e, 50)),
        "cached_token_ratio": _r(usage_ratio if usage_ratio is not None else engine_ratio),
        "cached_token_ratio_source": "usage" if usage_ratio is not None else "engine counters",
        "cached_token_ratio_engine": _r(engine_ratio),
        "cached_token_ratio_by_tier": by_tier,
        "load_imbalance": _r(imbalance, 3),
        "requests_by_instance": {i: int(v) for i, v in sorted(counts.items())},
        "instance_source": "engine counters" if counts is engine_requests else "headers",
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "throughput_rps": _r(len(ok) / wall if wall else None, 3),
        "output_tokens_per_s": _r(completion / wall if wall else None, 1),
        **prediction_accuracy(records),
        "gateway_headers": sorted({h for r in records for h in r.gateway_headers}),
    }


def write_json_md(out: Path, result: dict[str, Any], markdown: str) -> None:
    """`<out>.json` (the result) and `<out>.md` (its report), and the report on stdout."""
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown)
    print(markdown)


def machine() -> dict[str, Any]:
    """What ran the benchmark, for the report."""
    import os

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3f}{unit}"
    return f"{v}{unit}"


TABLE_COLUMNS = (
    ("ttft_p50_s", "TTFT p50 s"),
    ("ttft_p90_s", "TTFT p90 s"),
    ("ttft_p99_s", "TTFT p99 s"),
    ("tpot_p50_s", "TPOT p50 s"),
    ("e2e_p50_s", "E2E p50 s"),
    ("outside_engine_ttft_mean_s", "TTFT outside engine, mean s"),
    ("gateway_cpu_ms_per_request", "gateway CPU ms/req"),
    ("gateway_cpu_wait_ms_per_request", "gateway wait for CPU ms/req"),
    ("tierd_cpu_ms_per_request", "tierds' CPU ms/req"),
    ("cached_token_ratio", "cached ratio"),
    ("load_imbalance", "imbalance"),
    ("throughput_rps", "req/s"),
    ("requests", "requests"),
    ("errors", "errors"),
    ("machine_load_mean", "machine load"),
    ("machine_cpu_busy_share", "machine CPU busy"),
)


def gateway_table(gateways: Mapping[str, Mapping[str, Any]]) -> str:
    """The main Markdown table: one row per gateway."""
    head = "| gateway | " + " | ".join(t for _, t in TABLE_COLUMNS) + " |"
    sep = "|---|" + "---:|" * len(TABLE_COLUMNS)
    rows = [head, sep]
    for name, res in gateways.items():
        if res.get("skipped"):
            rows.append(f"| {name} | skipped: {res['skipped']} |" + " |" * (len(TABLE_COLUMNS) - 1))
            continue
        rows.append(f"| {name} | " + " | ".join(_fmt(res.get(k)) for k, _ in TABLE_COLUMNS) + " |")
    return "\n".join(rows)


def overhead_table(overhead: Mapping[str, Any]) -> str:
    """Gateway overhead: added latency and the highest rate with p99 added < 10 ms."""
    rows = [
        "| gateway | mode | streams | added p50 ms | added p99 ms | max rate (p99 added < 10 ms) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, res in overhead.get("gateways", {}).items():
        if res.get("skipped"):
            rows.append(f"| {name} | skipped: {res['skipped']} | | | | |")
            continue
        for case in res.get("cases", []):
            rate = case.get("max_rate_rps")
            rate_s = "below lowest tried" if rate is None else f"{rate:g} req/s"
            if case.get("max_rate_capped"):
                rate_s = f"≥ {rate:g} req/s (highest tried)"
            rows.append(
                f"| {name} | {case['mode']} | {case['streams']} | "
                f"{_fmt(case.get('added_p50_ms'))} | {_fmt(case.get('added_p99_ms'))} | "
                f"{rate_s} |"
            )
    return "\n".join(rows)


def claims_table(claims: Mapping[str, Any]) -> str:
    """The seed's tiering claims next to what this run measured."""
    rows = [
        "| concurrent / instance | TTFT p50 tiers s | TTFT p50 no array s | change | "
        "throughput tiers tok/s | no array tok/s | change |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in claims.get("cases", []):
        rows.append(
            f"| {case['concurrency_per_instance']} | {_fmt(case.get('ttft_p50_tiers_s'))} | "
            f"{_fmt(case.get('ttft_p50_no_array_s'))} | "
            f"{_fmt(case.get('ttft_p50_change_pct'), '%')}"
            f" | {_fmt(case.get('throughput_tiers_tok_s'))} | "
            f"{_fmt(case.get('throughput_no_array_tok_s'))} | "
            f"{_fmt(case.get('throughput_change_pct'), '%')} |"
        )
    return "\n".join(rows)


def accuracy_table(gateways: Mapping[str, Mapping[str, Any]]) -> str:
    """Precise accuracy: predicted cached tokens against the engine's reported ones."""
    rows = [
        "| gateway | requests with both | predicted = reported | over | under | "
        "mean abs error, tokens | predicted / reported cached tokens |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, res in gateways.items():
        if res.get("skipped"):
            continue
        if not res.get("prediction_requests"):
            heads = ", ".join(f"`{h}`" for h in res.get("gateway_headers", [])) or "none"
            rows.append(f"| {name} | exposes no prediction (x- headers: {heads}) | | | | | |")
            continue
        rows.append(
            f"| {name} | {res['prediction_requests']} | "
            f"**{100 * res['prediction_exact_share']:.1f}%** | {res['prediction_over']} | "
            f"{res['prediction_under']} | {res['prediction_mean_abs_error_tokens']} | "
            f"{res['predicted_cached_tokens']} / {res['reported_cached_tokens']} |"
        )
    return "\n".join(rows)


def _intro(results: Mapping[str, Any]) -> str:
    cfg = results.get("config", {})
    if cfg.get("engines") == "vllm":
        return (
            f"Run {results.get('started_at', '')}; {cfg.get('instances')} real vLLM engines "
            f"({cfg.get('engine', '')}), each started fresh for each gateway and warmed up. "
            f"Workload: {cfg.get('workload_note', '')} Seed {cfg.get('seed')}. "
            "Latencies are wall seconds."
        )
    return (
        f"Run {results.get('started_at', '')}; workload `{cfg.get('workload')}`, "
        f"{cfg.get('instances')} simulated instances (profile `{cfg.get('profile')}`, "
        f"time scale {cfg.get('time_scale')}, arrivals compressed {cfg.get('compress')}x), "
        f"seed {cfg.get('seed')}. Latencies are wall seconds ÷ time scale, i.e. what the "
        "modelled hardware would show."
    )


def render_markdown(results: Mapping[str, Any]) -> str:
    """report.md: what ran, the tables, the plots and the commands to reproduce it."""
    gateways = results.get("gateways", {})
    lines = [
        f"# warmgate side-by-side: {results.get('name', '')}",
        "",
        _intro(results),
        "",
        "## Gateways",
        "",
        gateway_table(gateways),
        "",
    ]
    repeats = results.get("repeat_rows") or []
    if len(repeats) > 1 and results.get("repeated"):
        orders = results["repeated"].get("orders") or []
        lines += [
            f"The rows above are each figure's median over {len(repeats)} repeats (every "
            "gateway on fresh engines in each, the order rotated each repeat).",
            "",
            "## Repeats, medians and ratios",
            "",
            repeats_markdown(results["repeated"]),
            "",
        ]
        for i, rows in enumerate(repeats):
            order = " → ".join(orders[i]) if i < len(orders) else ""
            lines += [f"### Repeat {i + 1} (order: {order})", "", gateway_table(rows), ""]
    if any(r.get("prediction_requests") for r in gateways.values()):
        lines += [
            "## Precise accuracy",
            "",
            "Share of answered requests whose predicted cached tokens "
            "(`x-warmgate-cached-tokens`) equal the engine's "
            "`usage.prompt_tokens_details.cached_tokens`, over the whole replay.",
            "",
            accuracy_table(gateways),
            "",
        ]
    if any("tierd_saved_blocks" in r for r in gateways.values()):
        lines += ["## tierd", "", TIERS_NOTE, "", tiers_table(gateways), ""]
    notes = results.get("notes") or []
    if notes:
        lines += ["Notes:", "", *[f"- {n}" for n in notes], ""]
    if results.get("overhead"):
        ov = results["overhead"]
        lines += ["## Gateway overhead (zero-latency engines)", "", ov.get("method", ""), ""]
        lines += [overhead_table(ov), ""]
    if results.get("claims"):
        cl = results["claims"]
        lines += ["## The seed's tiering claims, measured", "", cl.get("method", ""), ""]
        if cl.get("skipped"):
            lines += [f"Not measured: {cl['skipped']}", ""]
        else:
            lines += [claims_table(cl), ""]
        lines += [f"Seed's claim: {cl.get('seed_claim', '')}", ""]
    plots = results.get("plots") or []
    if plots:
        lines += ["## Plots", "", *[f"![{p}]({p})" for p in plots], ""]
    lines += ["## Reproduce", "", "```", results.get("command", ""), "```", ""]
    m = results.get("machine", {})
    lines += [
        "## Machine",
        "",
        f"{m.get('cpus')} CPUs ({m.get('processor')}), {m.get('platform')}, "
        f"Python {m.get('python')}. Load generator, gateway and engines share these cores.",
        "",
    ]
    return "\n".join(lines)
