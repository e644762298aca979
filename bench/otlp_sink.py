"""An OTLP/HTTP trace receiver on loopback (POST /v1/traces, protobuf decoded with
opentelemetry-proto, which the `otel` extra brings): what `bench compare --breakdown` collects
the gateway's, vLLM's and tierd's spans with, and the tests' receiver. Spans are kept as the
protobuf messages (`span.name`, `trace_id`, `start_time_unix_nano`, `attributes`, `events`);
`attributes(span)` reads their attributes into a dict."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


class SpanSink:
    """A real OTLP/HTTP trace receiver: every span it was sent, with its service name."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.spans: list[tuple[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                ok = self.path == "/v1/traces"
                if ok:
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    with receiver.lock:
                        for rs in request.resource_spans:
                            service = next(
                                a.value.string_value
                                for a in rs.resource.attributes
                                if a.key == "service.name"
                            )
                            for ss in rs.scope_spans:
                                receiver.spans.extend((service, s) for s in ss.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def of_trace(self, trace_id: str) -> dict[str, tuple[str, Any]]:
        with self.lock:
            return {s.name: (svc, s) for svc, s in self.spans if s.trace_id.hex() == trace_id}

    def by_trace(self) -> dict[str, list[tuple[str, Any]]]:
        """Every span received so far, grouped by trace id (hex)."""
        out: dict[str, list[tuple[str, Any]]] = {}
        with self.lock:
            for svc, s in self.spans:
                out.setdefault(s.trace_id.hex(), []).append((svc, s))
        return out

    def count(self) -> int:
        with self.lock:
            return len(self.spans)

    def take(self, trace_ids: set[str]) -> dict[str, list[tuple[str, Any]]]:
        """The spans of these traces, grouped by trace id, forgotten here."""
        out: dict[str, list[tuple[str, Any]]] = {}
        with self.lock:
            kept = []
            for svc, s in self.spans:
                tid = s.trace_id.hex()
                if tid in trace_ids:
                    out.setdefault(tid, []).append((svc, s))
                else:
                    kept.append((svc, s))
            self.spans = kept
        return out

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def named(self, name: str) -> list[tuple[str, Any]]:
        """Every span of this name, in any trace: (service, span)."""
        with self.lock:
            return [(svc, s) for svc, s in self.spans if s.name == name]


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        v = a.value
        kind = v.WhichOneof("value")
        if kind == "array_value":
            out[a.key] = [x.string_value for x in v.array_value.values]
        else:
            out[a.key] = getattr(v, kind)
    return out
