"""A real OTLP/HTTP trace receiver on loopback for tests (POST /v1/traces, protobuf decoded
with opentelemetry-proto, from the `otel` extra): every span it was sent, with its service
name. The session's one receiver is the `otlp_receiver` fixture (tests/conftest.py)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.support.procs import free_port


class Receiver:
    """A real OTLP/HTTP trace receiver: every span it was sent, with its service name."""

    def __init__(self) -> None:
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

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def of_trace(self, trace_id: str) -> dict[str, tuple[str, Any]]:
        with self.lock:
            return {s.name: (svc, s) for svc, s in self.spans if s.trace_id.hex() == trace_id}

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
