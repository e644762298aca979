"""The proxy's fast paths end to end, against a real loopback engine stand-in that echoes
the body it received (base64, in a response header) and streams fixed chunks: a body that
needs no change reaches the engine byte for byte (a stream that may be continued: with
`"return_token_ids":true` appended to its bytes, gateway/upstream/token_ids.py); one that
does is patched and nothing else; relayed streams still yield TTFT, usage and reported
cached tokens."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.fleet import Fleet, fleet_behind_script

MODEL = "echo-model"

UPSTREAM = r"""
import base64, json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

def chunk(delta, usage=None, choices=True):
    c = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "echo-model",
         "choices": [{"index": 0, "delta": delta, "finish_reason": None}] if choices else []}
    if usage is not None:
        c["usage"] = usage
    return ("data: " + json.dumps(c) + "\n\n").encode()

USAGE = {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41,
         "prompt_tokens_details": {"cached_tokens": 32}}

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args): pass
    def do_GET(self):
        data = json.dumps({"object": "list", "data": [{"id": "echo-model"}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_POST(self):
        raw = self.rfile.read(int(self.headers["content-length"]))
        body = json.loads(raw)
        with_usage = (body.get("stream_options") or {}).get("include_usage")
        frames = [chunk({"role": "assistant", "content": ""}),
                  chunk({"content": "Hail"})]
        if body.get("logprobs"):  # a token the engine found impossible: json writes -Infinity
            lp = {"content": [{"token": "Hail", "logprob": float("-inf"), "top_logprobs": []}]}
            frames[1] = frames[1].replace(b'"finish_reason"', b'"logprobs": '
                                          + json.dumps(lp).encode() + b', "finish_reason"')
        if with_usage:
            frames.append(chunk({}, USAGE, choices=False))
        frames.append(b"data: [DONE]\n\n")
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("x-echo-body", base64.b64encode(raw).decode())
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for f in frames:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(f), f))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with fleet_behind_script(
        tmp_path_factory.mktemp("gw-passthrough"), UPSTREAM, "echo", "/v1/models"
    ) as f:
        yield f


def echoed(r: httpx.Response) -> bytes:
    return base64.b64decode(r.headers["x-echo-body"])


def frames(text: str) -> list[str]:
    return [f[len("data: ") :] for f in text.split("\n\n") if f]


def test_a_body_that_needs_no_change_reaches_the_engine_byte_for_byte(fleet: Fleet) -> None:
    before = fleet.admin("stats")
    raw = (
        '{ "model" : "echo-model", "stream": true, "stream_options": {"include_usage": true},\n'
        '  "messages": [{"role": "user", "content": "caf\\u00e9 été"}], "x_extra": [1, 2.50] }'
    ).encode()
    r = httpx.post(
        f"{fleet.base}/v1/chat/completions",
        content=raw,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 200
    assert echoed(r) == raw[:-1].rstrip() + b',"return_token_ids":true}'
    got = frames(r.text)
    assert got[-1] == "[DONE]"
    assert json.loads(got[1])["choices"][0]["delta"]["content"] == "Hail"
    assert json.loads(got[-2])["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
    after = fleet.admin("stats")
    assert after["ttft_s"]["samples"] == before["ttft_s"]["samples"] + 1
    assert after["cached_tokens"]["reported"] == before["cached_tokens"]["reported"] + 32


def test_a_stream_without_usage_is_patched_and_the_usage_chunk_hidden(fleet: Fleet) -> None:
    body = {
        "model": "echo-model",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "x_extra": {"k": None},
    }
    before = fleet.admin("stats")
    r = httpx.post(f"{fleet.base}/v1/chat/completions", json=body)
    assert r.status_code == 200
    assert json.loads(echoed(r)) == {
        **body,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    got = frames(r.text)
    assert got[-1] == "[DONE]" and all("usage" not in json.loads(f) for f in got[:-1])
    after = fleet.admin("stats")
    assert after["cached_tokens"]["reported"] == before["cached_tokens"]["reported"] + 32


def test_a_non_stream_request_is_streamed_upstream_and_assembled(fleet: Fleet) -> None:
    body = {"model": "echo-model", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{fleet.base}/v1/chat/completions", json=body)
    assert r.status_code == 200
    sent = json.loads(echoed(r))
    assert sent == {**body, "stream": True, "stream_options": {"include_usage": True}}
    answer = r.json()
    assert answer["choices"][0]["message"]["content"] == "Hail"
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 32


def test_an_assembled_answer_keeps_what_the_engine_wrote_beyond_strict_json(
    fleet: Fleet,
) -> None:
    # a logprob of -Infinity (Python's json writes it; strict encoders refuse it): the
    # assembled answer says what the engine said, not a 500
    body = {"model": "echo-model", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{fleet.base}/v1/chat/completions", json={**body, "logprobs": True})
    assert r.status_code == 200, r.text
    assert "-Infinity" in r.text
    answer = json.loads(r.text)
    assert answer["choices"][0]["message"]["content"] == "Hail"
    assert answer["choices"][0]["logprobs"]["content"][0]["logprob"] == float("-inf")


def test_fast_routes_keep_the_usual_answers_around_them(fleet: Fleet) -> None:
    r = httpx.get(f"{fleet.base}/v1/chat/completions", headers={"x-request-id": "rid-get"})
    assert r.status_code == 405
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert r.headers["x-request-id"] == "rid-get"
    r = httpx.post(
        f"{fleet.base}/v1/completions", content=b"{oops", headers={"x-request-id": "rid-bad"}
    )
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert r.headers["x-request-id"] == "rid-bad"
    r = httpx.post(f"{fleet.base}/v1/completions", json={"model": "echo-model", "prompt": "hi"})
    assert r.status_code == 200 and r.headers["x-request-id"].startswith("req_")
