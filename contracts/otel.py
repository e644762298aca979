"""When a warmgate process exports OpenTelemetry traces, and how: the standard `OTEL_*`
variables, read the same way by the gateway and by tierd's connector inside vLLM.

On when an OTLP endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) and neither `OTEL_SDK_DISABLED=true` nor
`OTEL_TRACES_EXPORTER=none` says otherwise. The SDK reads the rest itself:
`OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` / `_ARG`
(parent-based by default), the exporter's headers and timeouts. `OTEL_EXPORTER_OTLP_PROTOCOL`
may be `http/protobuf` (the default) or `grpc` (with `opentelemetry-exporter-otlp-proto-grpc`
installed). The SDK is imported only by `tracer_provider`, so a process with tracing off never
loads it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from contracts.errors import ConfigurationError


def tracing_wanted(env: Mapping[str, str]) -> bool:
    """Whether the standard variables ask for trace export."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def engine_traces_endpoint(env: Mapping[str, str]) -> tuple[str, str] | None:
    """Where an engine started beside a traced gateway sends its own spans, and by which
    protocol: (url, protocol) for vLLM's `--otlp-traces-endpoint` and
    `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`; None when tracing is off. OTLP/HTTP wants the
    signal's path on the general endpoint; gRPC takes the endpoint as it is."""
    if not tracing_wanted(env):
        return None
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    url = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if not url:
        url = env["OTEL_EXPORTER_OTLP_ENDPOINT"]
        if protocol == "http/protobuf":
            url = url.rstrip("/") + "/v1/traces"
    return url, protocol


def tracer_provider(env: Mapping[str, str], default_service: str, extra: str) -> Any:
    """A TracerProvider exporting in batches as the variables say; `extra` names the pip
    extra that installs the SDK, for the error when it is missing."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigurationError(
            f"OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is missing "
            f"({exc}): pip install {extra}"
        ) from None
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or default_service})
    provider = TracerProvider(resource=resource)  # OTEL_TRACES_SAMPLER is its own
    provider.add_span_processor(BatchSpanProcessor(_exporter(env)))
    return provider


def _exporter(env: Mapping[str, str]) -> Any:
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()  # the endpoint, headers, timeout: OTEL_EXPORTER_OTLP_*
    if protocol == "grpc":
        try:  # not in the `otel` extra
            grpc = importlib.import_module("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
        except ImportError as exc:
            raise ConfigurationError(
                f"OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc "
                f"({exc})"
            ) from None
        return grpc.OTLPSpanExporter()
    raise ConfigurationError(
        f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: warmgate exports http/protobuf or grpc"
    )
