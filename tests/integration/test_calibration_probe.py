"""The join probe (gateway/fleet/calibration_probe.py) with real processes: simulated engines
at two speeds are priced as such before any routed request (configured at startup, and
added at runtime); with the probe off no probe request reaches an engine; every probe
prompt carries a cache salt of its own and asks for one token; a prompt predicted to run past
the probe's budget is not sent; a probe that never answers delays nothing past its timeout and
the instance is routed to afterwards."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.fleet import MODEL, Engine, Fleet, wait_until
from tests.support.procs import ManagedProcess, free_port

FAST, SLOW = 0.02, 1.0  # wall seconds per modelled second: the slow engine is 50x slower


def cold_chat() -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "A stranger asks for the road. " * 800}],
        "max_tokens": 4,
    }


def predicted(fleet: Fleet) -> dict[str, float]:
    """Each candidate's predicted TTFT for a cold prompt (a dry run: nothing changes)."""
    r = httpx.post(f"{fleet.base}/admin/route/explain", json=cold_chat(), timeout=10)
    r.raise_for_status()
    return {c["instance"]: c["predicted_ttft_s"] for c in r.json()["candidates"]}


def calibrated(fleet: Fleet) -> set[str]:
    return set(fleet.admin("stats")["router"]["policy_stats"]["instances"])


def engine_steps(engine: Engine) -> int:
    return int(httpx.get(f"{engine.url}/stats", timeout=10).json()["steps"])


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Engine]]:
    tmp = tmp_path_factory.mktemp("probe-engines")
    out = {
        "fast": Engine(tmp, "fast", FAST, 0),
        "slow": Engine(tmp, "slow", SLOW, 1),
        "late": Engine(tmp, "late", SLOW, 2),
    }
    try:
        for e in out.values():
            e.start()
        for e in out.values():
            e.wait()
        yield out
    finally:
        for e in out.values():
            e.stop()


def gateway(tmp: Path, instances: list[dict[str, Any]], **settings: Any) -> Fleet:
    return Fleet(tmp, 0, extra_instances=instances, settings=settings).start()


def test_probe_off_sends_nothing(engines: dict[str, Engine], tmp_path: Path) -> None:
    e = engines["fast"]
    before = engine_steps(e)
    fleet = gateway(tmp_path, [{"id": e.id, "url": e.url}], calibration={"probe": False})
    try:
        assert fleet.admin("stats")["router"]["policy_stats"]["instances"] == {}
        assert engine_steps(e) == before  # the engine computed nothing
    finally:
        fleet.stop()


def test_the_probe_prices_the_slow_engine_slow_before_any_request(
    engines: dict[str, Engine], tmp_path: Path
) -> None:
    fast, slow, late = engines["fast"], engines["slow"], engines["late"]
    fleet = gateway(tmp_path, [{"id": e.id, "url": e.url} for e in (fast, slow)])
    try:
        stats = fleet.admin("stats")
        assert sum(stats["requests"].values()) == 0  # nothing routed yet
        assert calibrated(fleet) == {"fast", "slow"}
        ttft = predicted(fleet)
        assert ttft["slow"] > 5 * ttft["fast"], ttft
        # an instance added at runtime is probed too (unprobed, the prior would price it
        # as the fastest fit known)
        r = httpx.post(
            f"{fleet.base}/admin/instances", json={"id": late.id, "url": late.url}, timeout=30
        )
        assert r.status_code == 201, r.text
        wait_until(lambda: "late" in calibrated(fleet), 30, "the late instance probed")
        ttft = predicted(fleet)
        assert ttft["late"] > 5 * ttft["fast"], ttft
    finally:
        fleet.stop()


# An engine stand-in that records every body posted to it (GET /records) and answers like a
# chat completion with one token, or never answers (argv[2] == "hang"), or answers after 2 ms a
# word ("slow").
RECORDER = r"""
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

bodies = []
lock = threading.Lock()
SHORT = 600  # the context length of modes "short" (reported on /v1/models) and "refuse"

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args): pass
    def _send(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/records":
            with lock:
                self._send(list(bodies))
        else:
            card = {"id": "rec-model"}
            if sys.argv[2] == "short":
                card["max_model_len"] = SHORT
            self._send({"object": "list", "data": [card]})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        with lock:
            bodies.append(body)
        if sys.argv[2] == "hang":
            time.sleep(3600)
        words = len(body["messages"][0]["content"].split())
        if sys.argv[2] == "slow":
            time.sleep(0.002 * words)
        if sys.argv[2] in ("short", "refuse") and words + 1 > SHORT:
            data = json.dumps({"error": {"message": "prompt too long", "type": "BadRequestError",
                                         "param": None, "code": 400}}).encode()
            self.send_response(400)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self._send({"id": "c", "object": "chat.completion", "created": 0, "model": "rec-model",
                    "choices": [{"index": 0, "finish_reason": "length",
                                 "message": {"role": "assistant", "content": "Hail"}}],
                    "usage": {"prompt_tokens": words, "completion_tokens": 1,
                              "total_tokens": words + 1}})

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def recorder(tmp: Path, mode: str) -> tuple[ManagedProcess, str]:
    script = tmp / "recorder.py"
    script.write_text(RECORDER)
    port = free_port()
    proc = ManagedProcess([sys.executable, str(script), str(port), mode], tmp / f"{mode}.log")
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(f"{url}/records")
    return proc, url


def test_every_probe_prompt_is_salted_of_its_own_and_asks_one_token(tmp_path: Path) -> None:
    proc, url = recorder(tmp_path, "answer")
    try:
        sizes = [64, 256, 1024]
        fleet = gateway(tmp_path, [{"id": "rec", "url": url}], calibration={"probe_tokens": sizes})
        try:
            bodies = httpx.get(f"{url}/records", timeout=10).json()
            assert len(bodies) == 1 + len(sizes)  # an untimed warm-up, then the sizes
            assert len(bodies[0]["messages"][0]["content"].split()) < min(sizes)
            assert bodies[0]["max_tokens"] == 1
            salts = [b["cache_salt"] for b in bodies]
            assert all(isinstance(s, str) and s for s in salts)
            assert len(set(salts)) == len(salts)
            assert all(b["max_tokens"] == 1 and b["model"] == "rec-model" for b in bodies)
            assert [len(b["messages"][0]["content"].split()) for b in bodies[1:]] == sizes
            instances = fleet.admin("stats")["router"]["policy_stats"]["instances"]
            assert "rec" in instances  # the samples reached the policy
        finally:
            fleet.stop()
    finally:
        proc.stop()


@pytest.mark.parametrize("mode", ["short", "refuse"])
def test_a_size_over_the_engine_context_is_skipped_and_the_others_count(
    tmp_path: Path, mode: str
) -> None:
    """vLLM refuses a prompt longer than its max_model_len with a 400: a size that does not
    fit is not sent where the engine reports its context length ("short"), and one the
    engine refuses anyway ("refuse") costs only that sample."""
    proc, url = recorder(tmp_path, mode)
    try:
        sizes = [64, 1024, 256]
        fleet = gateway(tmp_path, [{"id": "rec", "url": url}], calibration={"probe_tokens": sizes})
        try:
            bodies = httpx.get(f"{url}/records", timeout=10).json()
            sent = [len(b["messages"][0]["content"].split()) for b in bodies[1:]]
            assert sent == ([64, 256] if mode == "short" else [64, 1024, 256])
            samples = fleet.admin("stats")["router"]["policy_stats"]["instances"]
            assert "rec" in samples  # the sizes that fit were measured and reached the policy
        finally:
            fleet.stop()
    finally:
        proc.stop()


def test_a_prompt_predicted_past_the_budget_is_not_sent(tmp_path: Path) -> None:
    """2 ms a word: 1,024 words would take 2 s, but 256 took 0.5 s at about 0.7 s into a
    2.5 s budget, and 1,024 is predicted at 0.5 x 4 x 1.5 = 3 s: not sent, so the engine is
    not left computing a prompt the gateway gave up on when routed requests arrive."""
    proc, url = recorder(tmp_path, "slow")
    try:
        sizes = [64, 256, 1024]
        fleet = gateway(
            tmp_path,
            [{"id": "rec", "url": url}],
            calibration={"probe_tokens": sizes, "probe_timeout_s": 2.5},
        )
        try:
            bodies = httpx.get(f"{url}/records", timeout=10).json()
            assert [len(b["messages"][0]["content"].split()) for b in bodies[1:]] == [64, 256]
            assert "rec" in fleet.admin("stats")["router"]["policy_stats"]["instances"]
        finally:
            fleet.stop()
    finally:
        proc.stop()


def test_a_probe_that_never_answers_delays_nothing_past_its_timeout(tmp_path: Path) -> None:
    proc, url = recorder(tmp_path, "hang")
    try:
        fleet = gateway(
            tmp_path, [{"id": "hung", "url": url}], calibration={"probe_timeout_s": 1.0}
        )
        try:
            assert httpx.get(f"{url}/records", timeout=10).json()  # the probe was sent
            body = {**cold_chat(), "model": "rec-model"}
            r = httpx.post(f"{fleet.base}/admin/route/explain", json=body, timeout=10)
            assert r.status_code == 200, r.text
            assert r.json()["decision"]["instance"] == "hung"  # routed to, probe or not
        finally:
            fleet.stop()
    finally:
        proc.stop()
