"""A poison request (one every engine answers with an internal error) is tried on two
instances, not all of them, and answered with `x-should-retry: false`, so one SDK call costs
at most two engine 500s; busy answers (503) still go round every instance. A Redis URL's
password never appears in `/readyz` nor in the log."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.fleet import Fleet
from tests.support.procs import ManagedProcess, free_port

MODEL = "poison-model"

UPSTREAM = r"""
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

posts = {"n": 0}
lock = threading.Lock()

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args): pass
    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health":
            self._send(200, {})
        elif self.path == "/count":
            self._send(200, posts)
        else:
            self._send(200, {"object": "list", "data": [{"id": "poison-model"}]})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        with lock:
            posts["n"] += 1
        status = 503 if body["messages"][0]["content"] == "busy" else 500
        err = {"message": "engine failed", "type": "server_error", "param": None, "code": None}
        self._send(status, {"error": err})

for port in sys.argv[1:]:
    server = ThreadingHTTPServer(("127.0.0.1", int(port)), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
threading.Event().wait()
"""


def test_poison_request_is_not_retried_everywhere(tmp_path: Path) -> None:
    script = tmp_path / "poison.py"
    script.write_text(UPSTREAM)
    ports = [free_port() for _ in range(4)]
    upstream = ManagedProcess([sys.executable, str(script), *map(str, ports)], tmp_path / "up.log")
    try:
        upstream.wait_http(f"http://127.0.0.1:{ports[0]}/health")
        instances = [{"id": f"p{i}", "url": f"http://127.0.0.1:{p}"} for i, p in enumerate(ports)]
        # no join probe: its prompts would reach the upstream and be counted with the retries
        fleet = Fleet(
            tmp_path, 0, extra_instances=instances, settings={"calibration": {"probe": False}}
        ).start()
        try:
            count = f"http://127.0.0.1:{ports[0]}/count"
            client = openai.OpenAI(base_url=f"{fleet.base}/v1", api_key="x", max_retries=3)
            with pytest.raises(openai.InternalServerError) as info:
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "poison"}]
                )
            assert info.value.response.headers["x-should-retry"] == "false"
            assert httpx.get(count).json()["n"] == 2  # two instances, no SDK retry
            r = httpx.post(
                f"{fleet.base}/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "busy"}]},
            )
            assert r.status_code == 503
            assert r.headers["x-should-retry"] == "true"
            assert httpx.get(count).json()["n"] == 2 + 4  # busy: every instance was asked
            client.close()
        finally:
            fleet.stop()
    finally:
        upstream.stop()


def test_redis_password_is_redacted_in_readyz_and_logs(tmp_path: Path) -> None:
    secret = "hunter2-very-secret"
    dead = free_port()  # nothing listens here: the shared state is down from the start
    fleet = Fleet(
        tmp_path,
        1,
        settings={
            "state": {
                "backend": "redis",
                "redis_url": f"redis://warmgate:{secret}@127.0.0.1:{dead}/0",
                "pool": "redact-test",
            }
        },
    ).start()
    try:
        body = httpx.get(f"{fleet.base}/readyz").text
        assert "shared_state" in body
        assert secret not in body
        assert fleet.gateway is not None
        assert secret not in fleet.gateway.log_path.read_text(errors="replace")
    finally:
        fleet.stop()
