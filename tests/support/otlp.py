"""The tests' OTLP/HTTP receiver is the benchmarks' (bench/otlp_sink.py); the session's one
receiver is the `otlp_receiver` fixture (tests/conftest.py)."""

from bench.otlp_sink import SpanSink as Receiver
from bench.otlp_sink import attributes

__all__ = ["Receiver", "attributes"]
