"""Time to first token in front of real vLLM: at the first chunk that carries a token, and
for the instance that produced it only (a failed attempt before it does not count)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.launch.vllm_fleet import VllmFleet
from tests.support.procs import free_port
from tests.support.vllm import SERVED_MODEL, Gateway, VllmFleets, gateway_config, gateway_for

pytestmark = [pytest.mark.slow, pytest.mark.fleet("vllm")]
FAIL_AFTER_S = 4.0


@pytest.fixture(scope="module")
def fleet(vllm_fleets: VllmFleets) -> VllmFleet:
    return vllm_fleets.get()


def _stream(base: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    return chunks


def test_ttft_is_recorded_when_every_delta_is_empty(
    fleet: VllmFleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Forced onto a special token (printed as nothing), every streamed delta is empty;
    the tokens still came, and so did the first one's time."""
    body = {
        "model": SERVED_MODEL,
        "stream": True,
        "max_tokens": 4,
        "ignore_eos": True,
        "logit_bias": {"0": 100},  # <|endoftext|>: a special token, skipped in the text
        "messages": [{"role": "user", "content": f"[empty-{uuid.uuid4().hex[:8]}] hi"}],
    }
    direct = _stream(fleet.engines[0].url, body)
    deltas = [c["choices"][0]["delta"] for c in direct if c.get("choices")]
    assert len(deltas) >= 4 and not any(d.get("content") for d in deltas), deltas
    with gateway_for(tmp_path_factory.mktemp("empty"), fleet) as gw:
        before = gw.admin("stats")["ttft_s"]["samples"]
        _stream(gw.base, {**body, "messages": [{"role": "user", "content": "[e2] hi"}]})
        time.sleep(0.3)
        assert gw.admin("stats")["ttft_s"]["samples"] == before + 1


class _SlowFailure(BaseHTTPRequestHandler):
    """An engine that is healthy, serves the model, and fails every completion late."""

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": SERVED_MODEL}]})
        elif self.path == "/health":
            self._send(200, {})
        else:
            self._send(404, {"error": {"message": "no", "type": "not_found"}})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        time.sleep(FAIL_AFTER_S)
        self._send(503, {"error": {"message": "overloaded", "type": "server_error"}})


@pytest.fixture
def failing_engine() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _SlowFailure)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_after_a_failover_ttft_excludes_the_failed_attempt(
    fleet: VllmFleet, failing_engine: str, tmp_path: Path
) -> None:
    config = gateway_config(
        fleet,
        free_port(),
        routing={"mode": "approximate", "policy": "round_robin"},
        kv_events={"enabled": False},
    )
    config["instances"] = [
        {"id": "late-failure", "url": failing_engine, "models": [SERVED_MODEL]},
        config["instances"][0],
    ]
    gw = Gateway(tmp_path, config).wait_ready()
    try:
        for i in range(2):  # round robin: one of the two tries the failing instance first
            body = {
                "model": SERVED_MODEL,
                "stream": True,
                "max_tokens": 2,
                "messages": [{"role": "user", "content": f"[fo-{i}-{uuid.uuid4().hex[:6]}]"}],
            }
            _stream(gw.base, body)
        assert gw.admin("stats")["failovers"] == 1
        time.sleep(0.3)
        lines = [json.loads(ln) for ln in gw.proc.tail(400).splitlines() if '"ttft_s"' in ln]
        served = [ln for ln in lines if ln.get("outcome") == "ok"]
        assert len(served) == 2, lines
        failed_over = max(served, key=lambda ln: ln["duration_s"])
        assert failed_over["duration_s"] > FAIL_AFTER_S  # it did wait for the failure
        assert failed_over["ttft_s"] < failed_over["duration_s"] - FAIL_AFTER_S + 0.5
    finally:
        gw.stop()
