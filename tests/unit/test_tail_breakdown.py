"""bench.tail_breakdown: a request's TTFT split into parts from its trace's spans (the
gateway's request and attempt with its first-token event, vLLM's llm_request, tierd's
lookup and load), and the slowest 5% against all."""

from __future__ import annotations

import os
from typing import Any

import pytest

try:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span
except ImportError:  # the `otel` extra (in `dev`)
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("opentelemetry-proto missing: pip install -e '.[dev]'", allow_module_level=True)

from bench.replay import RequestRecord
from bench.tail_breakdown import breakdown, markdown, parts_of

MS = 1_000_000  # ns


def span(name: str, start_ms: float, end_ms: float, **attrs: float) -> Span:
    s = Span(
        name=name, start_time_unix_nano=int(start_ms * MS), end_time_unix_nano=int(end_ms * MS)
    )
    for key, value in attrs.items():
        s.attributes.append(
            KeyValue(key=key.replace("__", "."), value=AnyValue(double_value=value))
        )
    return s


def trace(ttft_engine_s: float, queue_s: float, prefill_s: float) -> list[tuple[str, Any]]:
    """A request that arrived at 0 ms; the gateway dispatched at 3 ms and saw its first token
    at 3 + 5 + vLLM's TTFT ms (5 ms in the engine's HTTP server)."""
    request = span("POST /v1/chat/completions", 0, 500)
    attempt = span("upstream attempt", 3, 500)
    ev = attempt.events.add()
    ev.name, ev.time_unix_nano = "first token", int((3 + 5 + ttft_engine_s * 1e3) * MS)
    vllm = span(
        "llm_request", 4, 400,
        gen_ai__latency__time_to_first_token=ttft_engine_s,
        gen_ai__latency__time_in_queue=queue_s,
        gen_ai__latency__time_in_model_prefill=prefill_s,
    )  # fmt: skip
    lookup = span("tierd lookup", 10, 12)
    load = span("tierd load", 20, 50)
    return [("warmgate", request), ("warmgate", attempt), ("vllm", vllm), ("tierd", lookup),
            ("tierd", load)]  # fmt: skip


def test_parts_add_up_to_the_clients_ttft() -> None:
    ttft = 0.120  # client side: 120 ms
    parts = parts_of(ttft, trace(0.100, 0.060, 0.030))
    assert parts["gateway"] == pytest.approx(0.120 - 0.105)  # all but the engine leg
    assert parts["dispatch"] == pytest.approx(0.003)
    assert parts["engine_http"] == pytest.approx(0.005)
    assert (parts["queue"], parts["prefill"]) == (0.060, 0.030)
    assert parts["engine_other"] == pytest.approx(0.010)
    assert (parts["lookup"], parts["load"]) == (pytest.approx(0.002), pytest.approx(0.030))
    additive = ("gateway", "engine_http", "queue", "prefill", "engine_other")
    assert sum(parts[p] for p in additive) == pytest.approx(ttft)


def test_a_request_without_gateway_spans_gets_the_engine_parts_only() -> None:
    vllm_only = [s for s in trace(0.100, 0.060, 0.030) if s[1].name == "llm_request"]
    parts = parts_of(0.150, vllm_only)
    assert "gateway" not in parts and "lookup" not in parts
    assert parts["outside_engine"] == pytest.approx(0.050)
    assert parts_of(0.150, []) == {}


def test_the_tail_is_the_slowest_five_percent() -> None:
    records, traces = [], {}
    for i in range(40):
        slow = i >= 38  # 2 of 40: the slowest 5%, both queued long
        rec = RequestRecord(index=i, scheduled_s=0.0, ok=True, trace_id=f"{i:032x}")
        rec.ttft_s = 1.2 if slow else 0.12
        traces[rec.trace_id] = trace(1.18 if slow else 0.10, 1.1 if slow else 0.06, 0.03)
        records.append(rec)
    records.append(RequestRecord(index=40, scheduled_s=0.0, ok=False))  # not answered: out
    out = breakdown(records, traces)
    assert out is not None
    assert (out["requests"], out["traced"], out["tail"]["n"]) == (40, 40, 2)
    assert out["tail"]["ttft_min_s"] == 1.2
    assert out["tail"]["parts"]["queue"]["share"] == pytest.approx(1.1 / 1.2, abs=1e-3)
    assert out["all"]["n"] == 40
    table = markdown({"warmgate-ttft": out, "peer": None})
    assert "warmgate-ttft slowest 5%" in table and "peer" not in table
    assert breakdown([RequestRecord(index=0, scheduled_s=0.0, ok=True)], {}) is None


def test_decode_steps_that_printed_nothing_are_their_own_part() -> None:
    # the client's first token came at 120 ms, its first text at 170 ms
    rec = RequestRecord(index=0, scheduled_s=0.0, ok=True, trace_id=f"{1:032x}")
    rec.first_token_s, rec.ttft_s = 0.120, 0.170
    out = breakdown([rec], {rec.trace_id: trace(0.100, 0.060, 0.030)})
    assert out is not None
    parts = out["all"]["parts"]
    assert parts["first_text"]["mean_s"] == pytest.approx(0.050)
    assert parts["gateway"]["mean_s"] == pytest.approx(0.120 - 0.105)  # to the first token
    assert sum(parts[name]["mean_s"] for name in ("first_text", "gateway", "engine_http")) + sum(
        parts[name]["mean_s"] for name in ("queue", "prefill", "engine_other")
    ) == pytest.approx(0.170, abs=1e-3)
