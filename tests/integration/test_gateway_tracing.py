"""OpenTelemetry traces end to end: a gateway process configured by the standard OTEL_*
variables exports to a real OTLP/HTTP receiver on loopback (POST /v1/traces, protobuf decoded
with opentelemetry-proto), in front of an engine stand-in that echoes the `traceparent` it
got. The client's W3C trace is continued (the request span's parent is the client's span) and
forwarded to the engine as the upstream attempt's span; decide carries the routing attributes;
the first token is an event. Off (no endpoint), the client's `traceparent` reaches the engine
untouched and the SDK is never imported."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contracts.otel import tracing_wanted
from gateway.observe.tracing import RequestTrace, Tracing
from tests.e2e.fleet import Fleet, fleet_behind_script, wait_until

try:
    from tests.support.otlp import Receiver, attributes
except ImportError:  # the `otel` extra (in `dev`)
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("opentelemetry-proto missing: pip install -e '.[dev]'", allow_module_level=True)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
REQUEST_SPAN = "POST /v1/chat/completions"

UPSTREAM = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

def chunk(delta, usage=None):
    c = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "echo-model",
         "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": None}]}
    if usage:
        c["usage"] = usage
    return ("data: " + json.dumps(c) + "\n\n").encode()

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args): pass
    def do_GET(self):
        data = json.dumps({"object": "list", "data": [{"id": "echo-model"}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        usage = {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}
        frames = [chunk({"role": "assistant", "content": ""}), chunk({"content": "Hail"}),
                  chunk({}, usage), b"data: [DONE]\n\n"]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("x-echo-traceparent", self.headers.get("traceparent") or "none")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for f in frames:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(f), f))
        self.wfile.write(b"0\r\n\r\n")

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def _gateway(tmp: Path, otel: dict[str, str]) -> Iterator[Fleet]:
    """The echo engine and a gateway whose environment's OTEL_* variables are `otel`."""
    cm = fleet_behind_script(tmp, UPSTREAM, "echo", "/v1/models")
    with pytest.MonkeyPatch.context() as mp:  # the gateway process inherits them
        for name in [n for n in os.environ if n.startswith("OTEL_")]:
            mp.delenv(name)
        for name, value in otel.items():
            mp.setenv(name, value)
        fleet = cm.__enter__()
    try:
        yield fleet
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, otlp_receiver: Receiver) -> Iterator[Fleet]:
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "warmgate-test",
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    yield from _gateway(tmp_path_factory.mktemp("gw-traced"), otel)


@pytest.fixture(scope="module")
def untraced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from _gateway(tmp_path_factory.mktemp("gw-untraced"), {})


def _chat(base: str, headers: dict[str, str]) -> httpx.Response:
    body = {"model": "echo-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r


def test_client_trace_is_continued_and_forwarded(traced: Fleet, otlp_receiver: Receiver) -> None:
    r = _chat(traced.base, {"traceparent": TRACEPARENT})
    version, trace_id, engine_parent, flags = r.headers["x-echo-traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01")
    assert engine_parent != CLIENT_SPAN  # the engine's parent is our attempt span
    names = {REQUEST_SPAN, "decide", "upstream attempt"}
    spans = wait_until(
        lambda: (s := otlp_receiver.of_trace(TRACE_ID)) and names <= set(s) and s,
        what="the request's spans exported",
    )
    service, request = spans[REQUEST_SPAN]
    assert service == "warmgate-test"
    assert request.parent_span_id.hex() == CLIENT_SPAN
    _, decide = spans["decide"]
    _, attempt = spans["upstream attempt"]
    assert decide.parent_span_id == request.span_id == attempt.parent_span_id
    assert attempt.span_id.hex() == engine_parent
    attrs = attributes(decide)
    assert attrs["warmgate.instance"] == "echo" and attrs["warmgate.candidates"] == ["echo"]
    assert attrs["warmgate.policy"] and "warmgate.predicted_cached_tokens" in attrs
    assert attributes(attempt)["warmgate.attempt"] == 0
    assert [e.name for e in attempt.events] == ["first token"]
    assert attributes(request)["warmgate.outcome"] == "ok"


def test_a_request_without_trace_context_starts_one(traced: Fleet, otlp_receiver: Receiver) -> None:
    r = _chat(traced.base, {})
    _, trace_id, _, _ = r.headers["x-echo-traceparent"].split("-")
    spans = wait_until(
        lambda: (s := otlp_receiver.of_trace(trace_id)) and REQUEST_SPAN in s and s,
        what="a new trace exported",
    )
    assert spans[REQUEST_SPAN][1].parent_span_id == b""


def test_off_forwards_the_client_traceparent_untouched(untraced: Fleet) -> None:
    r = _chat(untraced.base, {"traceparent": TRACEPARENT})
    assert r.headers["x-echo-traceparent"] == TRACEPARENT


def test_off_is_a_no_op_without_the_sdk() -> None:
    # our module alone: redis-py's own observability imports the SDK when it is installed
    code = (
        "import sys; from gateway.observe.tracing import Tracing; t = Tracing(); "
        "assert not t.enabled; "
        f"t.begin([(b'traceparent', b'{TRACEPARENT}')]).finish('ok', ok=True); "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
    assert type(Tracing({}).begin([(b"traceparent", TRACEPARENT.encode())])) is RequestTrace


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"}, False),
    ],
)
def test_the_standard_variables_turn_it_on(env: dict[str, str], wanted: bool) -> None:
    assert tracing_wanted(env) is wanted
