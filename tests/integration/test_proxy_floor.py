"""bench.proxy_floor, the Python edge alone: each POST relayed unchanged to the next engine in
turn, on uvicorn and on the bare asyncio protocol (`bench compare`'s `floor` gateway)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.support.procs import ManagedProcess, free_port, python_module


class _Echo(BaseHTTPRequestHandler):
    """Answers a POST with its own name, the path and the body it received."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        answer = json.dumps(
            {"engine": self.server.name, "path": self.path, "body": body.decode()}  # type: ignore[attr-defined]
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def two_engines() -> Iterator[list[str]]:
    servers = []
    for name in ("a", "b"):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
        server.name = name  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    try:
        yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


@pytest.mark.parametrize("server", ["uvicorn", "raw"])
def test_the_floor_takes_the_engines_in_turn_and_passes_bodies_unchanged(
    server: str, two_engines: list[str], tmp_path: Path
) -> None:
    port = free_port()
    args = ["--port", str(port), "--server", server]
    for url in two_engines:
        args += ["--upstream", url + "/"]  # a trailing slash is not doubled
    proc = ManagedProcess(python_module("bench.proxy_floor", *args), tmp_path / "floor.log")
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/", timeout_s=30)
        seen = []
        with httpx.Client(timeout=10.0, trust_env=False) as client:
            for i in range(4):
                body = json.dumps({"n": i, "text": "é"})
                r = client.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=body)
                assert r.status_code == 200
                got = r.json()
                assert got["path"] == "/v1/chat/completions" and got["body"] == body
                seen.append(got["engine"])
        assert seen == ["a", "b", "a", "b"]
    finally:
        proc.stop()
