"""The gateway's HTTP surface against real simulated engines: OpenAI shapes, every client
error, streaming usage handling, request ids, routing headers, admin and ops endpoints."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from gateway.engine.sim import SIM
from tests.e2e.fleet import MODEL, Fleet, wait_until

LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(
        tmp_path_factory.mktemp("gw-api"),
        2,
        settings={"max_body_bytes": LIMIT, "tiers": {"stats_interval_s": 0.2}},  # policy: ttft
        engine_fields={"tierd_url": "http://127.0.0.1:9"},  # a tierd that is not there
    ).start()
    yield f
    f.stop()


@pytest.fixture
def client(fleet: Fleet) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fleet.base, timeout=30) as c:
        yield c


def chat(content: str = "Hello, blacksmith!", **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def assert_openai_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    assert err["param"] == param
    return err


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, "model"),
        ("/v1/chat/completions", {"model": 5, "messages": []}, "model"),
        ("/v1/chat/completions", {"model": MODEL}, "messages"),
        ("/v1/chat/completions", {"model": MODEL, "messages": []}, "messages"),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"content": "x"}]},
            "messages[0].role",
        ),
        ("/v1/chat/completions", chat(stream="yes"), "stream"),
        ("/v1/chat/completions", chat(stream_options={"include_usage": True}), "stream_options"),
        ("/v1/chat/completions", chat(max_tokens=0), "max_tokens"),
        ("/v1/chat/completions", chat(temperature="hot"), "temperature"),
        ("/v1/completions", {"model": MODEL}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": {"a": 1}}, "prompt"),
    ],
)
def test_invalid_fields_are_400_with_param(
    client: httpx.Client, path: str, body: dict, param: str
) -> None:
    err = assert_openai_error(client.post(path, json=body), 400, param)
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b"\xff\xfe"])
def test_malformed_body_is_400(client: httpx.Client, raw: bytes) -> None:
    r = client.post(
        "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert_openai_error(r, 400)


def test_unknown_model_is_404_model_not_found(client: httpx.Client) -> None:
    err = assert_openai_error(
        client.post("/v1/chat/completions", json={**chat(), "model": "gpt-nope"}), 404, "model"
    )
    assert err["code"] == "model_not_found"


def test_body_over_limit_is_413(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", json=chat("x" * (LIMIT + 10)))
    assert_openai_error(r, 413)


def test_unknown_route_is_openai_shaped_404(client: httpx.Client) -> None:
    assert_openai_error(client.get("/v1/nothing-here"), 404)


def test_request_id_is_echoed_forwarded_or_generated(client: httpx.Client) -> None:
    r = client.post(
        "/v1/chat/completions", json=chat(max_tokens=4), headers={"x-request-id": "rid-42"}
    )
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "rid-42"
    generated = client.post("/v1/chat/completions", json=chat(max_tokens=4)).headers["x-request-id"]
    other = client.post("/v1/chat/completions", json=chat(max_tokens=4)).headers["x-request-id"]
    assert generated and other and generated != other
    assert client.get("/v1/models").headers["x-request-id"]
    assert client.post("/v1/chat/completions", json={}).headers["x-request-id"]


def test_non_streaming_chat_carries_routing_headers_and_usage(
    fleet: Fleet, client: httpx.Client
) -> None:
    r = client.post("/v1/chat/completions", json=chat(max_tokens=5, some_unknown_field={"k": 1}))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"]
    assert body["usage"]["completion_tokens"] == 5
    assert r.headers["x-warmgate-instance"] in {e.id for e in fleet.engines}
    assert r.headers["x-warmgate-instance"] == r.headers["x-engine-instance"]
    assert int(r.headers["x-warmgate-cached-tokens"]) >= 0


def _events(text: str) -> list[object]:
    out: list[object] = []
    for frame in text.split("\n\n"):
        if frame.startswith("data: "):
            data = frame[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_stream_without_usage_request_has_no_usage(client: httpx.Client) -> None:
    with client.stream("POST", "/v1/chat/completions", json=chat(max_tokens=6, stream=True)) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = _events(r.read().decode())
    assert events[-1] == "[DONE]"
    chunks = [e for e in events if isinstance(e, dict)]
    assert chunks and all("usage" not in c for c in chunks)
    assert all(c["choices"] for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text


def test_stream_with_usage_ends_with_usage_chunk(client: httpx.Client) -> None:
    body = chat(max_tokens=6, stream=True, stream_options={"include_usage": True})
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        events = _events(r.read().decode())
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert isinstance(last, dict)
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] == 6


def test_streamed_completion(client: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as r:
        events = _events(r.read().decode())
    chunks = [e for e in events if isinstance(e, dict)]
    assert "".join(c["choices"][0]["text"] for c in chunks)
    assert events[-1] == "[DONE]"


def test_models_is_the_union_of_healthy_instances(client: httpx.Client) -> None:
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [MODEL]


def test_ops_endpoints(fleet: Fleet, client: httpx.Client) -> None:
    assert client.get("/livez").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"]["instances"]["healthy"] == len(fleet.engines)
    client.post("/v1/chat/completions", json=chat(max_tokens=3))
    client.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user"}]})
    metrics = client.get("/metrics").text
    for name in (
        'warmgate_requests_total{outcome="ok"}',
        'warmgate_requests_total{outcome="client_error"}',
        "warmgate_ttft_seconds_bucket",
        "warmgate_request_duration_seconds_bucket",
        'warmgate_routing_decisions_total{instance="sim-',
        "warmgate_reported_cached_tokens_total",
        "warmgate_predicted_cached_tokens_total",
        "warmgate_instance_healthy",
        # a young collection may not have run yet (gc.young is 50,000): the families
        "# TYPE warmgate_gc_pause_seconds histogram",
        "# TYPE warmgate_gc_cpu_seconds_total counter",
    ):
        assert name in metrics, name


def test_admin_views(fleet: Fleet, client: httpx.Client) -> None:
    persona = "You are Mira, the blacksmith of Eastvale. " * 40
    for turn in range(2):
        body = {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": persona},
                {"role": "user", "content": f"turn {turn}"},
            ],
            "max_tokens": 3,
            "stream": True,
            "prompt_cache_key": "guild/eastvale/player-admin",  # keys may hold slashes
        }
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            r.read()
    stats = client.get("/admin/stats").json()
    assert stats["requests"]["ok"] >= 2
    assert stats["ttft_s"]["samples"] >= 2 and stats["ttft_s"]["p50"] > 0
    assert stats["ttft_s"]["p99"] >= stats["ttft_s"]["p50"]
    assert stats["cached_tokens"]["predicted"] > 0  # the second turn reuses the first's blocks
    assert stats["cached_tokens"]["requests_with_report"] >= 2
    session = client.get("/admin/sessions/guild/eastvale/player-admin").json()
    assert session["known"] and session["last_instance"] in {e.id for e in fleet.engines}
    assert session["instances"][session["last_instance"]]["hbm"] > 0
    assert session["why"]
    assert client.get("/admin/sessions/nobody").status_code == 404
    instances = client.get("/admin/instances").json()["instances"]
    assert {i["id"] for i in instances} == {e.id for e in fleet.engines}
    assert all(i["health"]["state"] == "healthy" and i["health"]["reason"] for i in instances)
    assert sum(i["cached_tokens_believed"] for i in instances) > 0
    # each engine's HBM KV capacity, as its vllm:cache_config_info says, reached the policy
    expected = {e.id: SIM.kv_capacity(httpx.get(f"{e.url}/metrics").text) for e in fleet.engines}
    assert all(expected.values())

    def capacities() -> object:
        policy = client.get("/admin/stats").json()["router"]["policy_stats"]
        return policy["kv_capacity_tokens"] == expected

    wait_until(capacities, what="kv capacities discovered")


def test_route_explain_is_a_dry_run(fleet: Fleet, client: httpx.Client) -> None:
    before = client.get("/admin/stats").json()["router"]
    body = chat("The quest board says: " + "wolves in the forest. " * 30)
    for _ in range(3):  # explaining does not teach the policy anything either
        client.post("/admin/route/explain", json=body).raise_for_status()
    r = client.post("/admin/route/explain", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["decision"]["instance"] in {e.id for e in fleet.engines}
    assert out["decision"]["policy"] == "ttft"
    assert {c["instance"] for c in out["candidates"]} == {e.id for e in fleet.engines}
    for c in out["candidates"]:  # each candidate's predicted TTFT, and what it is made of
        parts = c["parts"]
        assert {"queue_wait_s", "load_s", "prefill_s"} <= set(parts)
        assert c["predicted_ttft_s"] == pytest.approx(sum(parts.values()))
        assert c["predicted_ttft_s"] > 0
        terms = c["score_terms"]  # what the policy minimised, term by term
        assert terms["predicted_ttft_s"] == c["predicted_ttft_s"]
        assert terms["score"] == pytest.approx(sum(v for k, v in terms.items() if k != "score"))
    chosen = next(c for c in out["candidates"] if c["instance"] == out["decision"]["instance"])
    assert out["decision"]["predicted_ttft_s"] == chosen["predicted_ttft_s"]
    lowest = min(c["score_terms"]["score"] for c in out["candidates"])
    assert chosen["score_terms"]["score"] <= lowest + max(0.01, 0.05 * lowest)  # or a near-tie
    assert out["request"]["blocks"] > 0
    as_get = client.request("GET", "/admin/route/explain", json=body)  # the same, by GET
    assert as_get.status_code == 200, as_get.text
    for key in ("instance", "policy", "cached_tokens"):
        assert as_get.json()["decision"][key] == out["decision"][key]
    after = client.get("/admin/stats").json()["router"]
    assert after["routed"] == before["routed"]
    for key in ("reuse_price", "reuse_lost_share", "saturated_decisions", "instances"):
        assert after["policy_stats"][key] == before["policy_stats"][key], key
    assert_openai_error(client.post("/admin/route/explain", json={"model": MODEL}), 400, "messages")


def test_non_streaming_answers_are_assembled_and_timed(client: httpx.Client) -> None:
    before = client.get("/admin/stats").json()["ttft_s"]["samples"]
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "The gate", "max_tokens": 7})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 7
    # the engine streamed it to the gateway: its first token was seen and timed
    assert client.get("/admin/stats").json()["ttft_s"]["samples"] == before + 1


def test_failed_prefetch_hint_never_fails_the_request(fleet: Fleet, client: httpx.Client) -> None:
    long_prompt = "The tavern is full of travellers from the south. " * 20  # several blocks
    r = client.post("/v1/chat/completions", json=chat(long_prompt, max_tokens=3))
    assert r.status_code == 200

    def failed_hints() -> bool:
        return 'warmgate_prefetch_hints_total{result="failed"}' in client.get("/metrics").text

    wait_until(failed_hints, what="the hint's failure is counted")
    instances = client.get("/admin/instances").json()["instances"]
    wait_until(
        lambda: all(
            "ConnectError" in str(i["tierd_stats"])
            for i in client.get("/admin/instances").json()["instances"]
        ),
        what="tierd stats polling reports the dead tierd",
    )
    assert all(i["tierd_url"] == "http://127.0.0.1:9" for i in instances)
