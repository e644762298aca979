"""sim.engine as a real process on loopback, driven over HTTP and a real ZMQ SUB socket."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import openai
import pytest
import zmq

from sim.engine.block_hash import BlockHasher, event_int
from tests.support.procs import ManagedProcess, free_port, python_module

MODEL = "sim-qwen2.5-32b"


class Engine:
    def __init__(self, proc: ManagedProcess, url: str, events: str):
        self.proc, self.url, self.events = proc, url, events


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    port, events_port = free_port(), free_port()
    events = f"tcp://127.0.0.1:{events_port}"
    log = Path(tmp_path_factory.mktemp("engine")) / "engine.log"
    proc = ManagedProcess(
        python_module(
            "sim.engine",
            "--port", str(port),
            "--instance-id", "eng-a",
            "--time-scale", "0.01",
            "--kv-events-endpoint", events,
        ),
        log,
        env={"PYTHONHASHSEED": "0"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(url + "/health")
        yield Engine(proc, url, events)
    finally:
        proc.stop()


@pytest.fixture
def client(engine: Engine) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=engine.url, timeout=30) as c:
        yield c


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def sse_events(response: httpx.Response) -> list[Any]:
    out: list[Any] = []
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: ")
        data = line[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def gauge(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_health_models_and_instance_header(client: httpx.Client) -> None:
    r = client.get("/health")
    assert r.status_code == 200 and r.headers["x-engine-instance"] == "eng-a"
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] > 0


def test_sglang_info_routes_for_smg(client: httpx.Client) -> None:
    info = client.get("/get_server_info").json()
    assert info["served_model_name"] == MODEL and info["page_size"] == 16
    assert client.get("/get_model_info").json()["is_generation"] is True
    (load,) = client.get("/get_load").json()
    assert load["num_reqs"] >= 0 and load["num_waiting_reqs"] >= 0


def test_request_id_is_echoed_and_names_the_completion(client: httpx.Client) -> None:
    r = client.post(
        "/v1/chat/completions",
        json=chat("Who goes there? " * 10, max_tokens=3),
        headers={"x-request-id": "abc-123"},
    )
    assert r.headers["x-request-id"] == "abc-123"
    assert r.json()["id"] == "chatcmpl-abc-123"
    stats = client.get("/stats").json()
    assert stats["instance_id"] == "eng-a" and stats["steps"] > 0
    assert stats["kv"]["hash_seeded"] is True and stats["kv_events"]["next_seq"] > 0


def test_chat_is_deterministic_and_second_turn_reports_cached_tokens(
    client: httpx.Client,
) -> None:
    prompt = "Greetings, keeper of the northern gate. " * 20
    first = client.post("/v1/chat/completions", json=chat(prompt, max_tokens=12))
    assert first.status_code == 200, first.text
    assert first.headers["x-engine-instance"] == "eng-a"
    body = first.json()
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "length"
    use = body["usage"]
    assert use["completion_tokens"] == 12
    assert use["total_tokens"] == use["prompt_tokens"] + 12
    assert use["prompt_tokens_details"]["cached_tokens"] == 0
    second = client.post("/v1/chat/completions", json=chat(prompt, max_tokens=12)).json()
    assert second["choices"][0]["message"]["content"] == choice["message"]["content"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == ((use["prompt_tokens"] - 1) // 16) * 16 > 0
    other = client.post("/v1/chat/completions", json=chat(prompt + "?", max_tokens=12)).json()
    assert other["choices"][0]["message"]["content"] != choice["message"]["content"]


def test_streamed_chat_with_usage_matches_plain(client: httpx.Client) -> None:
    prompt = "Tell me about the storm over Saltmere harbor."
    plain = client.post("/v1/chat/completions", json=chat(prompt, max_tokens=20)).json()
    req = chat(prompt, max_tokens=20, stream=True, stream_options={"include_usage": True})
    with client.stream("POST", "/v1/chat/completions", json=req) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-engine-instance"] == "eng-a"
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == plain["choices"][0]["message"]["content"]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 20
    with client.stream("POST", "/v1/chat/completions", json=chat(prompt, stream=True)) as r:
        no_usage = sse_events(r)
    assert all("usage" not in c for c in no_usage[:-1])


def test_completions_plain_stream_and_token_ids(client: httpx.Client) -> None:
    req = {"model": MODEL, "prompt": "The road to the old tower", "max_tokens": 8}
    body = client.post("/v1/completions", json=req).json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"]
    with client.stream("POST", "/v1/completions", json={**req, "stream": True}) as r:
        events = sse_events(r)
    streamed = "".join(e["choices"][0]["text"] for e in events[:-1])
    assert streamed == body["choices"][0]["text"]
    ids = client.post("/tokenize", json={"prompt": req["prompt"]}).json()["tokens"]
    by_ids = client.post("/v1/completions", json={**req, "prompt": ids}).json()
    assert by_ids["choices"][0]["text"] == body["choices"][0]["text"]
    assert by_ids["usage"]["prompt_tokens"] == len(ids)


def test_return_token_ids_as_vllm_places_them(client: httpx.Client) -> None:
    """`return_token_ids`: a chat stream's opening chunk holds the prompt's ids (those
    /tokenize gives), a completions stream's first choice chunk too; every step's chunk its
    generated ids; the plain answers hold the same ids; without the field, none of it."""
    req = chat("The lantern of the northern keep", max_tokens=12, stop=["zzz"])
    prompt_ids = client.post("/tokenize", json={"messages": req["messages"]}).json()["tokens"]
    with client.stream(
        "POST", "/v1/chat/completions", json={**req, "stream": True, "return_token_ids": True}
    ) as r:
        events = sse_events(r)[:-1]
    assert events[0]["prompt_token_ids"] == prompt_ids
    assert all("prompt_token_ids" not in e for e in events[1:])
    steps = [e["choices"][0] for e in events[1:]]
    assert all(len(c["token_ids"]) == 1 for c in steps) and len(steps) == 12
    generated = [t for c in steps for t in c["token_ids"]]
    plain = client.post("/v1/chat/completions", json={**req, "return_token_ids": True}).json()
    assert plain["prompt_token_ids"] == prompt_ids
    assert plain["choices"][0]["token_ids"] == generated
    text = "".join(c["delta"].get("content", "") for c in steps)
    assert text == plain["choices"][0]["message"]["content"]
    # the ids continue the answer: a completions prompt of the prompt's ids and the first
    # five generated ones gives ids of its own (the simulator's text is a function of its
    # prompt), reported the completions way
    cont = {"model": MODEL, "prompt": prompt_ids + generated[:5], "max_tokens": 4}
    with client.stream(
        "POST", "/v1/completions", json={**cont, "stream": True, "return_token_ids": True}
    ) as r:
        cevents = sse_events(r)[:-1]
    assert cevents[0]["choices"][0]["prompt_token_ids"] == prompt_ids + generated[:5]
    assert all("prompt_token_ids" not in e["choices"][0] for e in cevents[1:])
    assert sum(len(e["choices"][0]["token_ids"]) for e in cevents) == 4
    with client.stream("POST", "/v1/chat/completions", json={**req, "stream": True}) as r:
        bare = sse_events(r)[:-1]
    assert not any("token_ids" in json.dumps(e) for e in bare)


def test_batched_completion_prompts_get_one_choice_each(client: httpx.Client) -> None:
    prompts = ["The old tower", "The river keep at dusk", "A merchant of Saltmere"]
    singles = [
        client.post("/v1/completions", json={"model": MODEL, "prompt": p, "max_tokens": 5}).json()
        for p in prompts
    ]
    req = {"model": MODEL, "prompt": prompts, "max_tokens": 5}
    batch = client.post("/v1/completions", json=req).json()
    assert [c["index"] for c in batch["choices"]] == [0, 1, 2]
    assert [c["text"] for c in batch["choices"]] == [s["choices"][0]["text"] for s in singles]
    assert batch["usage"]["prompt_tokens"] == sum(s["usage"]["prompt_tokens"] for s in singles)
    assert batch["usage"]["completion_tokens"] == 15
    stream_req = {**req, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/completions", json=stream_req) as r:
        events = sse_events(r)
    texts = ["", "", ""]
    finished = set()
    for e in events[:-2]:
        (choice,) = e["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"]:
            finished.add(choice["index"])
    assert texts == [c["text"] for c in batch["choices"]] and finished == {0, 1, 2}
    assert events[-2]["usage"]["completion_tokens"] == 15
    too_many = client.post("/v1/completions", json={"model": MODEL, "prompt": ["x"] * 65})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "prompt"


def test_stop_strings_end_the_text_before_them(client: httpx.Client) -> None:
    req = chat("Sing me the ballad of the frost queen.", max_tokens=60)
    full = client.post("/v1/chat/completions", json=req).json()["choices"][0]["message"]
    text = full["content"]
    stop = text[10:14]
    stopped = client.post("/v1/chat/completions", json={**req, "stop": [stop, "@@@"]}).json()
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["choices"][0]["message"]["content"] == text[: text.index(stop)]
    with client.stream(
        "POST", "/v1/chat/completions", json={**req, "stop": stop, "stream": True}
    ) as r:
        events = sse_events(r)
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert streamed == text[: text.index(stop)]


def test_natural_end_is_stop_and_ignore_eos_runs_to_max(client: httpx.Client) -> None:
    body = client.post("/v1/chat/completions", json=chat("Hi.")).json()
    assert body["choices"][0]["finish_reason"] == "stop"
    n = body["usage"]["completion_tokens"]
    forced = client.post(
        "/v1/chat/completions", json=chat("Hi.", max_tokens=n + 5, ignore_eos=True)
    ).json()
    assert forced["usage"]["completion_tokens"] == n + 5
    assert forced["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        (chat("x", model="nope"), 404, "model", "model_not_found"),
        (chat("x", n=2), 400, "n", None),
        (chat("x", max_tokens=0), 400, "max_tokens", None),
        (chat("x", max_tokens=10_000_000), 400, "max_tokens", None),
        (chat("x", stop=5), 400, "stop", None),
        (chat("x", stream_options={"include_usage": True}), 400, "stream_options", None),
        ({"model": MODEL}, 400, "messages", None),
        ({"messages": [{"role": "user", "content": "x"}]}, 400, "model", None),
    ],
)
def test_errors_are_openai_shaped(
    client: httpx.Client, body: dict[str, Any], status: int, param: str, code: str | None
) -> None:
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["code"] == code and err["message"]


def test_official_openai_sdk_works_against_it(engine: Engine) -> None:
    client = openai.OpenAI(base_url=engine.url + "/v1", api_key="unused", max_retries=0)
    try:
        done = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hail, stranger!"}], max_tokens=6
        )
        assert done.choices[0].message.content and done.usage is not None
        assert done.usage.prompt_tokens_details is not None
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hail, stranger!"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == done.choices[0].message.content
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
        legacy = client.completions.create(model=MODEL, prompt="Once", max_tokens=4)
        assert legacy.choices[0].finish_reason == "length"
        assert [m.id for m in client.models.list()] == [MODEL]
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(
                model="gpt-nope", messages=[{"role": "user", "content": "x"}]
            )
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], n=2
            )
    finally:
        client.close()


def test_malformed_json_is_400(client: httpx.Client) -> None:
    r = client.post(
        "/v1/completions", content=b'{"model": ', headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_tokenize_counts_what_chat_charges(client: httpx.Client) -> None:
    messages = [
        {"role": "system", "content": "You are Elara, harbor master."},
        {"role": "user", "content": "Is there passage north?"},
    ]
    tok = client.post("/tokenize", json={"model": MODEL, "messages": messages}).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] > 0
    done = client.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 1}
    ).json()
    assert done["usage"]["prompt_tokens"] == tok["count"]
    assert client.post("/tokenize", json={"nothing": 1}).status_code == 400


def test_metrics_use_vllm_names(client: httpx.Client) -> None:
    client.post("/v1/chat/completions", json=chat("metrics please", max_tokens=2))
    text = client.get("/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ):
        assert f'{name}{{model_name="{MODEL}"' in text or f"{name}{{le=" in text, name
    assert gauge(client, "vllm:prefix_cache_queries_total") > 0
    assert 'vllm:cache_config_info{block_size="16",' in text


def test_client_disconnect_frees_the_slot(client: httpx.Client) -> None:
    req = chat("A very long tale, please.", max_tokens=120_000, ignore_eos=True, stream=True)
    with client.stream("POST", "/v1/chat/completions", json=req) as r:
        assert r.status_code == 200
        lines = r.iter_lines()  # kept referenced: a collected iterator closes the stream
        while not next(lines).startswith("data: "):
            pass
        assert gauge(client, "vllm:num_requests_running") == 1
    deadline = time.monotonic() + 20
    while gauge(client, "vllm:num_requests_running") != 0:
        assert time.monotonic() < deadline, "the aborted request still runs"
        time.sleep(0.05)
    assert gauge(client, "vllm:kv_cache_usage_perc") == 0


def test_client_gone_before_a_plain_response_frees_the_slot(engine: Engine) -> None:
    req = chat("Another very long tale.", max_tokens=120_000, ignore_eos=True)
    with (
        httpx.Client(base_url=engine.url, timeout=0.5) as impatient,
        pytest.raises(httpx.ReadTimeout),
    ):
        impatient.post("/v1/chat/completions", json=req)
    with httpx.Client(base_url=engine.url, timeout=30) as client:
        deadline = time.monotonic() + 20
        while gauge(client, "vllm:num_requests_running") != 0:
            assert time.monotonic() < deadline, "the abandoned request still runs"
            time.sleep(0.05)
        assert gauge(client, "vllm:kv_cache_usage_perc") == 0


def test_kv_events_arrive_with_vllm_hashes(engine: Engine, client: httpx.Client) -> None:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(engine.events)
    hasher = BlockHasher(16, "sha256_cbor", seed="0")
    try:
        deadline = time.monotonic() + 20
        attempt = 0
        while True:  # a SUB socket misses what is published before it joins: retry fresh
            attempt += 1
            prompt = f"Event probe {attempt}: the bells of the river keep ring at dusk. " * 4
            ids = client.post("/tokenize", json={"prompt": prompt}).json()["tokens"]
            r = client.post(
                "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}
            )
            assert r.status_code == 200
            expected = [event_int(h) for h in hasher.chain(ids)]
            stored = _stored_hashes(sub, timeout_ms=500)
            if expected[0] in stored:
                break
            assert time.monotonic() < deadline, "no KV event arrived"
        assert [h for h in stored if h in set(expected)] == expected
    finally:
        sub.close()
        ctx.term()


def _stored_hashes(sub: zmq.Socket[bytes], timeout_ms: int) -> list[int]:
    hashes: list[int] = []
    last_seq = -1
    while sub.poll(timeout_ms):
        topic, seq_bytes, payload = sub.recv_multipart()
        assert topic == b"kv-events" and len(seq_bytes) == 8
        seq = int.from_bytes(seq_bytes, "big")
        assert seq > last_seq
        last_seq = seq
        ts, events = msgpack.unpackb(payload)[:2]
        assert isinstance(ts, float)
        for ev in events:
            if ev["type"] == "BlockStored":
                assert ev["block_size"] == 16 and ev["medium"] == "GPU"
                assert len(ev["token_ids"]) == 16 * len(ev["block_hashes"])
                hashes.extend(ev["block_hashes"])
        timeout_ms = 100
    return hashes
