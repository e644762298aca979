"""Upstream failures the simulated engine never produces, from a real misbehaving HTTP
server on loopback: an OpenAI-shaped 503 passed through with its retry headers, a non-JSON
500 turned into a 502, and streams that die after their first byte ending in an OpenAI
`error` event then `data: [DONE]` (the SDK raises APIError)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.e2e.fleet import Fleet, fleet_behind_script

MODEL = "broken-model"

UPSTREAM = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "broken-model",
         "choices": [{"index": 0, "delta": {"content": "Hail"}, "finish_reason": None}]}

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args): pass
    def _send(self, status, body, ctype="application/json", extra=()):
        data = body.encode()
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health":
            self._send(200, "{}")
        else:
            self._send(200, json.dumps({"object": "list", "data": [{"id": "broken-model"}]}))
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        mode = body["messages"][0]["content"]
        if mode == "503":
            err = {"message": "engine overloaded", "type": "server_error", "param": None,
                   "code": "overloaded"}
            self._send(503, json.dumps({"error": err}), extra=[("retry-after", "3")])
        elif mode == "429":
            err = {"message": "slow down", "type": "rate_limit_error", "param": None,
                   "code": "rate_limited"}
            self._send(429, json.dumps({"error": err}), extra=[("retry-after", "1")])
        elif mode == "500-html":
            self._send(500, "<html>oops</html>", ctype="text/html")
        elif mode in ("cut-chunked", "cut-eof"):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            frame = ("data: " + json.dumps(CHUNK) + "\n\n").encode()
            if mode == "cut-chunked":
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            else:
                self.send_header("connection", "close")
                self.end_headers()
                self.wfile.write(frame)
            self.wfile.flush()
            self.close_connection = True
        else:
            err = {"message": "bad mode", "type": "invalid_request_error", "param": "messages",
                   "code": None}
            self._send(400, json.dumps({"error": err}))

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with fleet_behind_script(
        tmp_path_factory.mktemp("gw-upstream"), UPSTREAM, "broken", "/health"
    ) as f:
        yield f


def chat(mode: str, stream: bool = False) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": mode}], "stream": stream}


def test_openai_shaped_5xx_is_passed_through_with_retry_headers(fleet: Fleet) -> None:
    r = httpx.post(f"{fleet.base}/v1/chat/completions", json=chat("503"))
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "overloaded"
    assert r.headers["retry-after"] == "3"
    assert r.headers["x-should-retry"] == "true"


def test_non_json_5xx_becomes_502(fleet: Fleet) -> None:
    r = httpx.post(f"{fleet.base}/v1/chat/completions", json=chat("500-html"))
    assert r.status_code == 502
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert "x-should-retry" in r.headers


def test_upstream_4xx_is_passed_through_not_retried(fleet: Fleet) -> None:
    r = httpx.post(f"{fleet.base}/v1/chat/completions", json=chat("other"))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages"
    assert r.headers["x-warmgate-instance"] == "broken"


@pytest.mark.parametrize("mode", ["cut-chunked", "cut-eof"])
def test_stream_failing_after_first_byte_ends_with_error_event(fleet: Fleet, mode: str) -> None:
    with httpx.stream("POST", f"{fleet.base}/v1/chat/completions", json=chat(mode, True)) as r:
        assert r.status_code == 200
        text = r.read().decode()
    frames = [f for f in text.split("\n\n") if f]
    assert json.loads(frames[0][len("data: ") :])["choices"][0]["delta"]["content"] == "Hail"
    error = json.loads(frames[-2][len("data: ") :])["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert frames[-1] == "data: [DONE]"
    metrics = httpx.get(f"{fleet.base}/metrics").text
    assert 'warmgate_requests_total{outcome="upstream_error"}' in metrics


def test_sdk_raises_api_error_mid_stream(fleet: Fleet) -> None:
    client = openai.OpenAI(base_url=f"{fleet.base}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "cut-chunked"}], stream=True
    )
    received: list[str] = []
    with pytest.raises(openai.APIError):
        for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert received == ["Hail"]
    client.close()


@pytest.mark.parametrize("mode", ["cut-chunked", "cut-eof"])
def test_non_streaming_client_never_gets_a_half_answer(fleet: Fleet, mode: str) -> None:
    # the gateway streams from the engine and assembles; a cut stream is a failed attempt
    # (there is no other instance here, so the client gets a retryable 502, not half a text)
    r = httpx.post(f"{fleet.base}/v1/chat/completions", json=chat(mode))
    assert r.status_code == 502
    assert r.headers["x-should-retry"] == "true"
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_429_from_every_instance_is_passed_through(fleet: Fleet) -> None:
    r = httpx.post(f"{fleet.base}/v1/chat/completions", json=chat("429"))
    assert r.status_code == 429
    assert r.json()["error"]["code"] == "rate_limited"
    assert r.headers["retry-after"] == "1"
    metrics = httpx.get(f"{fleet.base}/metrics").text
    assert 'warmgate_upstream_errors_total{instance="broken",kind="status_429"}' in metrics
