"""One JSON log formatter (`contracts.json_logs`) for the gateway, tierd and the simulated
engine: the same line format from each, the gateway's with its request id and redaction."""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import pkgutil
import sys

import contracts
import gateway
import router
import sim
import tierd
from contracts.json_logs import MAX_FIELD_CHARS, JsonFormatter
from gateway.observe.logs import REQUEST_ID, logging_config
from tierd.serve import configure_logging as tierd_logging


def _record(msg: str, **extra: object) -> logging.LogRecord:
    record = logging.makeLogRecord({"name": "warmgate.test", "levelname": "WARNING", "msg": msg})
    record.__dict__.update(extra)
    return record


def test_one_formatter_class_in_the_product() -> None:
    found = []
    for pkg in (contracts, gateway, router, sim, tierd):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            try:
                module = importlib.import_module(info.name)
            except ImportError:  # the engine environment's modules (vllm, torch)
                continue
            for name, cls in inspect.getmembers(module, inspect.isclass):
                if cls.__module__ == info.name and issubclass(cls, logging.Formatter):
                    found.append(f"{info.name}.{name}")
    assert found == ["contracts.json_logs.JsonFormatter"]


def test_the_line_format() -> None:
    fmt = JsonFormatter(static={"instance": "sim-0"})
    line = json.loads(fmt.format(_record("hello %s", args=None, player="p" * 600, n=3)))
    assert set(line) == {"ts", "level", "logger", "msg", "instance", "player", "n"}
    assert line["level"] == "warning" and line["logger"] == "warmgate.test"
    assert line["ts"].endswith("Z") and line["ts"][10] == "T"
    assert line["instance"] == "sim-0" and line["n"] == 3
    assert line["player"].startswith("p" * MAX_FIELD_CHARS + "...(600 chars)")
    try:
        raise KeyError("boom")
    except KeyError:
        record = _record("failed")
        record.exc_info = sys.exc_info()
    assert "KeyError: 'boom'" in json.loads(fmt.format(record))["exc"]


def test_the_gateways_lines_carry_the_request_id_and_are_redacted() -> None:
    fmt = logging_config("info")["formatters"]["json"]["()"]()
    assert isinstance(fmt, JsonFormatter)
    token = REQUEST_ID.set("req-1")
    try:
        line = json.loads(fmt.format(_record("redis://u:hunter2@h:6379 down")))
        own = json.loads(fmt.format(_record("x", request_id="req-2")))
    finally:
        REQUEST_ID.reset(token)
    assert line["request_id"] == "req-1" and "hunter2" not in line["msg"]
    assert own["request_id"] == "req-2"
    assert "request_id" not in json.loads(fmt.format(_record("outside a request")))


def test_tierd_logs_through_the_same_formatter() -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        tierd_logging("info")
        (handler,) = root.handlers
        assert type(handler.formatter) is JsonFormatter
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
