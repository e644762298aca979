"""The soak over time, to tell where a drift comes from: for each interval between the
soak's samples, the client's TTFT percentiles beside the mean TTFT the gateway and the
engines measured themselves, the CPU each part used (gateway, engines, load processes, the
whole machine), and the load processes' garbage-collection pauses.

A TTFT that grows at the client but not at the gateway is the client's; one that grows at
the gateway but not at the engines is the gateway's; one that grows at the engines with the
machine's CPU near its cores is contention. Pure functions of what the soak collected.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.loadgen import Result, percentile

GATEWAY_TTFT = "warmgate_ttft_seconds"  # gateway.observe.metrics: arrival to first content chunk
ENGINE_TTFT = "vllm:time_to_first_token_seconds"  # the engines' own, arrival at the engine
GATEWAY_GC = "warmgate_gc_pause_seconds"  # gateway.observe.gc_pauses
GATEWAY_GC_CPU = "warmgate_gc_cpu_seconds_total"  # the same collections' CPU


def histogram_totals(text: str, name: str) -> tuple[float, float]:
    """(sum, count) of histogram `name` over all its label sets, from exposition text."""
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{name}_sum":
                total += float(sample.value)
            elif sample.name == f"{name}_count":
                count += float(sample.value)
    return total, count


def histogram_sums_by(text: str, name: str, label: str) -> dict[str, float]:
    """The sum of histogram `name` per value of `label` (e.g. GC pauses by generation)."""
    return samples_by(text, f"{name}_sum", label)


def samples_by(text: str, sample_name: str, label: str) -> dict[str, float]:
    """Samples named `sample_name` (a counter's `<name>_total`), summed per value of `label`."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == sample_name:
                key = sample.labels.get(label, "")
                out[key] = out.get(key, 0.0) + float(sample.value)
    return out


def gc_share(
    before: Mapping[str, Any], after: Mapping[str, Any], key: str = "gateway_gc_s"
) -> float | None:
    """The gateway's GC seconds (`key`: pauses, or with `gateway_gc_cpu_s` the collections'
    CPU) over its CPU seconds between two samples. Pauses are wall time: on a machine short
    of cores they also hold the time the process waited for one, and overstate the CPU."""
    cpu = float(after["cpu_s"]) - float(before["cpu_s"])
    if cpu <= 0 or key not in after or key not in before:
        return None
    return round((float(after[key]) - float(before[key])) / cpu, 4)


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _mean(d_sum: float, d_count: float) -> float | None:
    return round(d_sum / d_count, 4) if d_count > 0 else None


def _share(before: Mapping[str, Any], after: Mapping[str, Any], key: str, dt: float) -> float:
    return round((float(after[key]) - float(before[key])) / dt, 3)


def _client_cpu_share(cpu: Sequence[Sequence[tuple[float, float]]], t0: float, t1: float) -> float:
    """Cores the load processes used in [t0, t1), from each one's (monotonic, process_time)."""
    used = 0.0
    for series in cpu:
        inside = [(t, c) for t, c in series if t0 <= t <= t1]
        if len(inside) >= 2:
            (ta, ca), (tb, cb) = inside[0], inside[-1]
            used += (cb - ca) / (tb - ta) if tb > ta else 0.0
    return round(used, 3)


def series(
    samples: Sequence[Mapping[str, Any]],
    results: Sequence[Result],
    *,
    gc_pauses: Sequence[tuple[float, float, int]] = (),
    client_cpu: Sequence[Sequence[tuple[float, float]]] = (),
    every_s: float = 60.0,
) -> list[dict[str, Any]]:
    """One row per `every_s` of samples (t in minutes from the first sample)."""
    picked: list[Mapping[str, Any]] = []
    for s in samples:
        if not picked or s["t"] - picked[-1]["t"] >= every_s * 0.99:
            picked.append(s)
    rows: list[dict[str, Any]] = []
    starts = sorted(results, key=lambda r: r.started)
    for a, b in itertools.pairwise(picked):
        t0, t1 = float(a["t"]), float(b["t"])
        dt = t1 - t0
        inside = [r for r in starts if t0 <= r.started < t1]
        ttft = [r.ttft_s for r in inside if r.ttft_s is not None]
        pauses = [d for t, d, _ in gc_pauses if t0 <= t < t1]
        full = [d for t, d, gen in gc_pauses if t0 <= t < t1 and gen == 2]
        row: dict[str, Any] = {
            "t_min": round((t0 - float(picked[0]["t"])) / 60, 2),
            "requests": len(inside),
            "client_ttft_p50_s": _round(percentile(ttft, 50)),
            "client_ttft_p99_s": _round(percentile(ttft, 99)),
            "gateway_ttft_mean_s": _mean(
                b["gateway_ttft_sum"] - a["gateway_ttft_sum"],
                b["gateway_ttft_count"] - a["gateway_ttft_count"],
            ),
            "engine_ttft_mean_s": _mean(
                b["engine_ttft_sum"] - a["engine_ttft_sum"],
                b["engine_ttft_count"] - a["engine_ttft_count"],
            ),
            "gateway_cpu": _share(a, b, "cpu_s", dt),
            "engines_cpu": _share(a, b, "engines_cpu_s", dt),
            "client_cpu": _client_cpu_share(client_cpu, t0, t1),
            "machine_cpu": _share(a, b, "machine_busy_s", dt),
            "gateway_gc_pause_s": round(b["gateway_gc_s"] - a["gateway_gc_s"], 4),
            "gateway_gc_share": gc_share(a, b),
            "gateway_gc_cpu_share": gc_share(a, b, "gateway_gc_cpu_s"),
            "client_gc_pause_s": round(sum(pauses), 4),
            "client_gc_max_s": round(max(pauses, default=0.0), 4),
            "client_gc_full": len(full),  # full collections: what grows with a kept heap
        }
        rows.append(row)
    return rows
