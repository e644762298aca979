"""`python -m bench.tracing_cost`: the CPU one request's tracing costs in the gateway's process,
alone (gateway/observe/tracing.py's calls as the proxy makes them: begin with the client's
traceparent, decided, one attempt with its header injection, first token, finish), off and on
(sampler 1.0, the BatchSpanProcessor exporting over OTLP/HTTP to `--endpoint`, its thread's
CPU included: process CPU time). `bench overhead` measures the whole gateway; this isolates
tracing from the noise of a loaded machine."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import dataclass, field

from gateway.observe.tracing import Tracing

TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@dataclass
class _Decision:
    instance: str = "sim-0"
    policy: str = "ttft"
    reason: str = "lowest predicted ttft"
    cached_tokens: int = 1024
    predicted_ttft_s: float | None = 0.042


@dataclass
class _Routed:
    decision: _Decision = field(default_factory=_Decision)
    candidates: tuple[str, ...] = ("sim-0", "sim-1", "sim-2")
    binding: str | None = "kept"


def cpu_per_request_us(tracing: Tracing, requests: int) -> float:
    routed = _Routed()
    scope = [(b"host", b"127.0.0.1"), (b"traceparent", TRACEPARENT)]
    start = time.process_time()
    for _ in range(requests):
        trace = tracing.begin(scope)
        trace.decided(routed, "/v1/chat/completions")
        headers = {"content-type": "application/json", "x-request-id": "r"}
        trace.attempt("sim-0", 0, headers)
        trace.first_token(0.04)
        trace.finish("ok", ok=True)
    asyncio.run(tracing.aclose())  # the exports left: part of the cost
    return (time.process_time() - start) / requests * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing_cost", description=__doc__)
    parser.add_argument("--endpoint", required=True, help="an OTLP/HTTP receiver's base URL")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    on_env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": args.endpoint,
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_SERVICE_NAME": "warmgate-bench",
        # every span exported (and counted): the default queue (2048) drops at this rate
        "OTEL_BSP_MAX_QUEUE_SIZE": str(4 * args.requests),
    }
    rows = []
    for _ in range(args.repeats):
        off = cpu_per_request_us(Tracing({}), args.requests)
        os.environ.update(on_env)  # the SDK reads its sampler and exporter from os.environ
        try:
            on = cpu_per_request_us(Tracing(), args.requests)
        finally:
            for name in on_env:
                del os.environ[name]
        rows.append({"off_us": round(off, 2), "on_us": round(on, 2)})
    print(json.dumps({"requests": args.requests, "rounds": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
