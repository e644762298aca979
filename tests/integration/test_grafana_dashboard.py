"""The Grafana dashboard asks only for what the gateway exports: every metric a panel's query
names is on a real gateway's `/metrics` (as a counter's `_total`, a histogram's `_bucket`,
`_sum` or `_count`, or a gauge), and every label it groups or filters by is one of that
metric's labels."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gateway.fleet.kv_events import KvEventMetrics
from gateway.observe.metrics import GatewayMetrics
from gateway.pipeline.state_metrics import StateMetrics
from tests.e2e.fleet import MODEL, Fleet
from tests.support.procs import free_port

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "warmgate-dashboard.json"
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
KEYWORDS |= {"and", "or", "unless", "le"}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            yield node["expr"]
        for value in node.values():
            yield from exprs(value)
    elif isinstance(node, list):
        for value in node:
            yield from exprs(value)


def parse(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) a PromQL expression uses."""
    labels: set[str] = set()
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels |= {x.strip() for x in group.split(",") if x.strip()}
    for selector in re.findall(r"\{([^}]*)\}", expr):
        labels |= set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!=|!~|=)", selector))
    bare = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", bare)
    metrics = set()
    for m in _IDENT.finditer(bare):
        rest = bare[m.end() :].lstrip()
        if m.group() in KEYWORDS or rest.startswith("("):
            continue  # a function or a keyword
        metrics.add(m.group())
    return metrics, labels - {"le"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Sample name -> family type, from a real gateway's /metrics after a request."""
    fleet = Fleet(
        tmp_path_factory.mktemp("grafana"),
        1,
        settings={"kv_events": {"enabled": True}},
        engine_fields={"kv_events_endpoint": f"tcp://127.0.0.1:{free_port()}"},
    ).start()
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(f"{fleet.base}/v1/chat/completions", json=body, timeout=30).is_success
        text = httpx.get(f"{fleet.base}/metrics", timeout=10).text
    finally:
        fleet.stop()
    names: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(family.type, ("",)):
            names[family.name + suffix] = family.type
    yield names


def declared_labels() -> dict[str, set[str]]:
    """Family name -> its label names, from the gateway's metric objects."""
    registry = CollectorRegistry()
    gm = GatewayMetrics()
    collectors = [*vars(gm).values(), *vars(StateMetrics(registry)).values()]
    collectors += list(vars(KvEventMetrics(registry)).values())
    out: dict[str, set[str]] = {}
    for c in collectors:
        labelnames = getattr(c, "_labelnames", None)
        name = getattr(c, "_name", None)
        if labelnames is not None and name is not None:
            out[name] = set(labelnames)
    return out


def test_every_dashboard_query_names_an_exported_metric(exported: dict[str, str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = list(exprs(dashboard))
    assert len(queries) >= 10
    labels_of = declared_labels()
    problems = []
    for q in queries:
        metrics, labels = parse(q)
        assert metrics, f"no metric found in {q!r}"
        for metric in metrics:
            if metric not in exported:
                problems.append(f"{q!r}: {metric} is not exported")
        known = set()
        for metric in metrics:
            family = re.sub(r"_(total|bucket|sum|count)$", "", metric)
            known |= labels_of.get(family, labels_of.get(metric, set()))
        if labels - known:
            problems.append(f"{q!r}: labels {sorted(labels - known)} not on {sorted(metrics)}")
    assert problems == []


def test_the_parser_sees_metrics_and_labels() -> None:
    metrics, labels = parse(
        'sum by (instance, kind) (rate(warmgate_upstream_errors_total{kind="connect"}[1m]))'
        " / on (instance) warmgate_instance_healthy"
    )
    assert metrics == {"warmgate_upstream_errors_total", "warmgate_instance_healthy"}
    assert labels == {"instance", "kind"}
    metrics, _ = parse("histogram_quantile(0.9, sum by (le) (rate(x_bucket[5m])))")
    assert metrics == {"x_bucket"}
