"""The soak's over-time series and what feeds it: histogram totals from exposition text, the
load's rows kept outside the garbage collector, and the gateway's GC pause histogram."""

from __future__ import annotations

import gc
import math

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bench.loadgen import Result, Rows
from bench.soak_series import gc_share, histogram_sums_by, histogram_totals, series
from gateway.observe.gc_pauses import GcPauses


def test_histogram_totals_sum_every_label_set() -> None:
    reg = CollectorRegistry()
    h = Histogram("x_seconds", "x", ["model"], registry=reg)
    h.labels("a").observe(0.5)
    h.labels("b").observe(1.5)
    h.labels("b").observe(1.0)
    assert histogram_totals(generate_latest(reg).decode(), "x_seconds") == (3.0, 3.0)
    assert histogram_totals(generate_latest(reg).decode(), "absent_seconds") == (0.0, 0.0)


def test_gc_pauses_by_generation_and_their_share_of_cpu() -> None:
    reg = CollectorRegistry()
    h = Histogram("gc_seconds", "x", ["generation"], registry=reg)
    h.labels("0").observe(0.25)
    h.labels("0").observe(0.5)
    h.labels("2").observe(2.0)
    text = generate_latest(reg).decode()
    assert histogram_sums_by(text, "gc_seconds", "generation") == {"0": 0.75, "2": 2.0}
    before = {"cpu_s": 10.0, "gateway_gc_s": 1.0}
    assert gc_share(before, {"cpu_s": 30.0, "gateway_gc_s": 6.0}) == 0.25
    assert gc_share(before, before) is None  # no CPU spent: no share


def _sample(t: float, n: float, **kw: float) -> dict[str, float]:
    base = {
        "t": t, "cpu_s": 0.0, "engines_cpu_s": 0.0, "machine_busy_s": 0.0,
        "gateway_ttft_sum": 0.0, "gateway_ttft_count": 0.0, "engine_ttft_sum": 0.0,
        "engine_ttft_count": 0.0, "gateway_gc_s": 0.0,
    }  # fmt: skip
    return {**base, **{k: v * n for k, v in kw.items()}}


def test_series_puts_each_figure_in_its_interval() -> None:
    kw = {
        "cpu_s": 30.0, "engines_cpu_s": 60.0, "machine_busy_s": 90.0,
        "gateway_ttft_sum": 2.0, "gateway_ttft_count": 100.0,
        "engine_ttft_sum": 1.0, "engine_ttft_count": 100.0, "gateway_gc_s": 0.5,
    }  # fmt: skip
    samples = [_sample(1000 + 15 * i, i, **kw) for i in range(9)]  # every 15 s, linear
    results = [Result(started=1000 + i * 0.5, status=200, ttft_s=0.01) for i in range(120)]
    results[5].ttft_s = results[6].ttft_s = 0.5  # two slow ones in the first minute
    results[200 // 2 - 1].ttft_s = None  # no first token: not a TTFT
    rows = series(
        samples,
        results,
        gc_pauses=[(1010.0, 0.02, 2), (1011.0, 0.001, 0), (1070.0, 0.003, 1)],
        client_cpu=[[(1000.0, 0.0), (1060.0, 30.0), (1120.0, 60.0)]],
        every_s=60,
    )
    assert [r["t_min"] for r in rows] == [0.0, 1.0]
    first, second = rows
    assert first["requests"] == 120 and second["requests"] == 0
    assert first["client_ttft_p99_s"] == 0.5 and first["client_ttft_p50_s"] == 0.01
    assert second["client_ttft_p99_s"] is None
    # per 15 s sample, cpu_s grows by 30: two cores' worth
    assert first["gateway_cpu"] == 2.0 and first["engines_cpu"] == 4.0
    assert first["machine_cpu"] == 6.0
    assert first["gateway_ttft_mean_s"] == 0.02 and first["engine_ttft_mean_s"] == 0.01
    assert first["gateway_gc_pause_s"] == round(4 * 0.5, 4)
    assert first["gateway_gc_share"] == round(0.5 / 30.0, 4)
    assert first["client_gc_pause_s"] == 0.021 and first["client_gc_max_s"] == 0.02
    assert first["client_gc_full"] == 1 and second["client_gc_full"] == 0
    assert first["client_cpu"] == 0.5 and second["client_cpu"] == 0.5


def test_rows_round_trip_outside_the_collector() -> None:
    rows = Rows()
    rows.add(Result(started=1.0, status=200, ttft_s=0.25))
    rows.add(Result(started=2.0, status=0, error="ConnectError: refused"))
    rows.add(Result(started=3.0, status=200, ttft_s=0.1, failed_mid_stream=True, error="x"))
    back = rows.results()
    assert len(rows) == 3
    assert [(r.started, r.status, r.ttft_s, r.failed_mid_stream, r.error) for r in back] == [
        (1.0, 200, 0.25, False, None),
        (2.0, 0, None, False, "ConnectError: refused"),
        (3.0, 200, 0.1, True, "x"),
    ]
    assert math.isnan(rows.ttft_s[1])


def test_rows_add_nothing_for_the_collector_to_walk() -> None:
    rows = Rows()
    rows.add(Result(started=0.0, status=200, ttft_s=0.1))
    gc.collect()
    before = len(gc.get_objects())
    for i in range(20_000):
        rows.add(Result(started=float(i), status=200, ttft_s=0.1))
    gc.collect()
    assert len(gc.get_objects()) - before < 50  # a list of Results: 20,000 more


def _count(reg: CollectorRegistry, generation: str) -> float:
    value = reg.get_sample_value("warmgate_gc_pause_seconds_count", {"generation": generation})
    return value or 0.0


async def test_gc_pauses_are_observed_while_installed() -> None:
    reg = CollectorRegistry()
    pauses = GcPauses(reg)
    pauses.install()
    pauses.install()  # idempotent: one observation per collection
    try:
        gc.collect()
        assert _count(reg, "2") == 1.0
        cpu = reg.get_sample_value("warmgate_gc_cpu_seconds_total", {"generation": "2"})
        assert cpu is not None and cpu > 0.0  # a full collection takes some CPU
    finally:
        await pauses.remove()
    gc.collect()
    assert _count(reg, "2") == 1.0  # removed: no longer observed
