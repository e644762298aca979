"""Where the slowest requests' time to first token went (issue 21's tail breakdown), from the
spans of each request's trace: the client sends a `traceparent` of its own with every
request (`bench.replay`'s `trace`), the gateway continues it, vLLM's `llm_request` and
tierd's connector spans join it (`bench compare --breakdown` turns all three on).

Parts of a request's client-side TTFT, each measured on one clock:
- `first_text`: the client's TTFT (its first text) less its first token (`first_token_s`, a
  token whose text may be empty, as the gateway and vLLM count one): decode steps that
  printed nothing; the parts below divide the time to the first token;
- `gateway`: the client's first token less the gateway's engine leg (first-token event on
  its `upstream attempt` less the attempt's start): the way in and out between client and
  gateway, parsing, admission, decide, relaying the first token; `dispatch` is its part
  before the attempt starts (request span start to attempt start);
- `engine_http`: the engine leg less vLLM's own TTFT: the engine's HTTP server, chat template
  and tokenizer before the request reaches the engine core, and the first token's way back;
- `queue` (vLLM's `time_in_queue`), `prefill` (`time_in_model_prefill`) and `engine_other`
  (vLLM's TTFT less both);
- `lookup` and `load`: tierd's spans, which lie *inside* queue or prefill (a sync lookup runs
  on the scheduler loop while the request waits; an async load while it waits for its KV;
  a sync load in the forward pass) and are shown for where those went, not added.
A request whose spans are missing (a gateway that does not trace, an export dropped)
contributes only the parts its spans give; `traced` counts those with all of them.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.otlp_sink import SpanSink, attributes
from bench.replay import RequestRecord

REQUEST_SPAN_PREFIX = "POST /v1/"
PARTS = ("first_text", "gateway", "dispatch", "engine_http", "queue", "prefill", "engine_other")
INSIDE = ("lookup", "load")  # inside queue or prefill
TAIL_SHARE = 0.05


class BreakdownSink:
    """The receiver of one comparison's spans, and the settings that send them there."""

    EXPORT_EVERY_MS = 500  # OTEL_BSP_SCHEDULE_DELAY of the gateway and the engines

    def __init__(self) -> None:
        self.sink = SpanSink()

    def gateway_env(self) -> dict[str, str]:
        """warmgate's OTEL_ variables: every request sampled (the client's trace is)."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.sink.url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_TRACES_SAMPLER": "parentbased_always_on",
            "OTEL_SERVICE_NAME": "warmgate",
            "OTEL_BSP_SCHEDULE_DELAY": str(self.EXPORT_EVERY_MS),
            "OTEL_BSP_MAX_QUEUE_SIZE": "65536",  # a burst is exported late, never dropped
        }

    def engine_traces(self) -> tuple[str, str]:
        """vLLM's `--otlp-traces-endpoint` and protocol (FleetConfig.otlp_traces)."""
        return f"{self.sink.url}/v1/traces", "http/protobuf"

    async def collect(
        self, records: Sequence[RequestRecord], quiet_s: float = 2.0, within_s: float = 20.0
    ) -> dict[str, list[tuple[str, Any]]]:
        """The spans of these records' traces, once no span has arrived for `quiet_s`
        (exports come every EXPORT_EVERY_MS from each process)."""
        end = time.monotonic() + within_s
        last, quiet_since = self.sink.count(), time.monotonic()
        while time.monotonic() - quiet_since < quiet_s and time.monotonic() < end:
            await asyncio.sleep(0.25)
            now = self.sink.count()
            if now != last:
                last, quiet_since = now, time.monotonic()
        ids = {r.trace_id for r in records if r.trace_id}
        return await asyncio.to_thread(self.sink.take, ids)

    def stop(self) -> None:
        self.sink.stop()


def parts_of(ttft_s: float, spans: Iterable[tuple[str, Any]]) -> dict[str, float]:
    """One request's parts (seconds) from its trace's spans; only those its spans give."""
    request = attempt = vllm = None
    first_token_ns: int | None = None
    lookup_ns = load_ns = 0
    tierd = False
    for _, span in spans:
        name = span.name
        if name.startswith(REQUEST_SPAN_PREFIX) and request is None:
            request = span
        elif name == "upstream attempt":
            for event in span.events:
                if event.name == "first token":
                    attempt, first_token_ns = span, event.time_unix_nano
        elif name == "llm_request":
            vllm = attributes(span)
        elif name == "tierd lookup":
            lookup_ns += span.end_time_unix_nano - span.start_time_unix_nano
            tierd = True
        elif name == "tierd load":
            load_ns += span.end_time_unix_nano - span.start_time_unix_nano
            tierd = True
    out: dict[str, float] = {}
    leg_s: float | None = None
    if attempt is not None and first_token_ns is not None:
        leg_s = (first_token_ns - attempt.start_time_unix_nano) / 1e9
        out["gateway"] = ttft_s - leg_s
        if request is not None:
            out["dispatch"] = (attempt.start_time_unix_nano - request.start_time_unix_nano) / 1e9
    if vllm is not None:
        engine_ttft = float(vllm.get("gen_ai.latency.time_to_first_token", 0.0))
        queue = float(vllm.get("gen_ai.latency.time_in_queue", 0.0))
        prefill = float(vllm.get("gen_ai.latency.time_in_model_prefill", 0.0))
        out["queue"], out["prefill"] = queue, prefill
        out["engine_other"] = engine_ttft - queue - prefill
        out["engine_http"] = (leg_s if leg_s is not None else ttft_s) - engine_ttft
        if leg_s is None:  # no gateway spans: all of the rest is outside the engine
            out["outside_engine"] = ttft_s - engine_ttft
    if tierd:
        out["lookup"], out["load"] = lookup_ns / 1e9, load_ns / 1e9
    return out


def _stats(values: Sequence[float], ttft_mean: float) -> dict[str, float]:
    mean = statistics.fmean(values)
    return {
        "mean_s": round(mean, 4),
        "p50_s": round(statistics.median(values), 4),
        "share": round(mean / ttft_mean, 3) if ttft_mean > 0 else 0.0,
        "n": len(values),
    }


def _group(rows: Sequence[tuple[float, dict[str, float]]]) -> dict[str, Any]:
    ttft_mean = statistics.fmean(t for t, _ in rows)
    names = [*PARTS, *INSIDE, "outside_engine"]
    return {
        "n": len(rows),
        "ttft_mean_s": round(ttft_mean, 4),
        "ttft_min_s": round(min(t for t, _ in rows), 4),
        "parts": {
            name: _stats(values, ttft_mean)
            for name in names
            if (values := [p[name] for _, p in rows if name in p])
        },
    }


def _parts(
    ttft_s: float, first_token_s: float | None, spans: Iterable[tuple[str, Any]]
) -> dict[str, float]:
    """`parts_of` the time to the first token, and the text's lag behind it."""
    first = ttft_s if first_token_s is None else min(first_token_s, ttft_s)
    return {"first_text": ttft_s - first, **parts_of(first, spans)}


def breakdown(
    records: Sequence[RequestRecord],
    traces: Mapping[str, Sequence[tuple[str, Any]]],
    tail_share: float = TAIL_SHARE,
) -> dict[str, Any] | None:
    """The parts of the slowest `tail_share` of the answered requests and of all of them;
    None when no request was traced."""
    rows = [
        (r.ttft_s, _parts(r.ttft_s, r.first_token_s, traces.get(r.trace_id, ())))
        for r in records
        if r.ok and r.ttft_s is not None and r.trace_id
    ]
    if not rows:
        return None
    rows.sort(key=lambda row: row[0], reverse=True)
    tail = rows[: max(1, round(len(rows) * tail_share))]
    complete = {"gateway", "queue", "prefill"}
    return {
        "requests": len(rows),
        "traced": sum(1 for _, p in rows if complete <= p.keys()),
        "tail_share": tail_share,
        "tail": _group(tail),
        "all": _group(rows),
    }


def markdown(by_gateway: Mapping[str, Mapping[str, Any] | None]) -> str:
    """One table: a row per gateway and group, each part's mean in ms and its share of TTFT."""
    names = [*PARTS, *INSIDE]
    head = "| gateway | requests | TTFT mean | " + " | ".join(names) + " |"
    lines = [
        "Tail breakdown: the slowest 5% of requests by TTFT against all of them; each part's "
        "mean in ms (share of mean TTFT). lookup and load lie inside queue or prefill "
        "(bench/tail_breakdown.py).",
        "",
        head,
        "|" + "---|" * (3 + len(names)),
    ]
    for gw, b in by_gateway.items():
        if not b:
            continue
        for label in ("tail", "all"):
            g = b[label]
            cells = []
            for name in names:
                part = g["parts"].get(name)
                cells.append(
                    f"{part['mean_s'] * 1e3:.0f} ({part['share'] * 100:.0f}%)" if part else "-"
                )
            who = f"{gw} slowest 5%" if label == "tail" else f"{gw} all"
            mean_ms = g["ttft_mean_s"] * 1e3
            lines.append(f"| {who} | {g['n']} | {mean_ms:.0f} ms | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
