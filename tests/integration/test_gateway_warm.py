"""POST /v1/warm and per-request priority and TTFT deadlines (issue 22, items 1 and 3),
against the gateway in front of real simulated engines: the warm's contract and the next
turn's cached tokens, a warm giving way to real work and going on after it, the deadline's
early answer, the 400s."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import httpx
import openai
import pytest

from tests.e2e.fleet import MODEL, Fleet, wait_until

BLOCK = 16  # the simulated engine's KV block


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(tmp_path_factory.mktemp("gw-warm"), 2).start()  # policy ttft, memory bindings
    yield f
    f.stop()


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One engine at 20x real time: a long prefill is still running when the test acts."""
    f = Fleet(
        tmp_path_factory.mktemp("gw-warm-slow"),
        1,
        time_scale=20.0,
        settings={
            "warm": {"max_real_in_flight": 1},
            "priority": {"background_max_in_flight": 1},
        },
    ).start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def giving_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The slow engine, its gateway's warms ending when they give way (no resume)."""
    warm = {"max_real_in_flight": 1, "resume_after_yield": False}
    f = Fleet(
        tmp_path_factory.mktemp("gw-warm-giving-up"), 1, time_scale=20.0, settings={"warm": warm}
    )
    yield f.start()
    f.stop()


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One engine at 20x real time; one background prefill at a time, a 1 s wait for it."""
    priority = {"background_prefills": 1, "background_wait_s": 1.0}
    f = Fleet(
        tmp_path_factory.mktemp("gw-gated"), 1, time_scale=20.0, settings={"priority": priority}
    )
    yield f.start()
    f.stop()


@pytest.fixture(scope="module")
def busy_pair(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Fleet]:
    """Two engines at 20x real time with session bindings in a real Redis (a pool of its
    own), as replicas share them: bindings apply only where there is a choice."""
    state = {"backend": "redis", "redis_url": redis_url, "pool": f"warm-{uuid4().hex}"}
    settings = {"warm": {"max_real_in_flight": 1}, "state": state}
    f = Fleet(tmp_path_factory.mktemp("gw-warm-pair"), 2, time_scale=20.0, settings=settings)
    yield f.start()
    f.stop()


@pytest.fixture
def client(fleet: Fleet) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fleet.base, timeout=60) as c:
        yield c


def lore(player: str, n: int = 40) -> list[dict[str, str]]:
    text = " ".join(
        f"The smith of {player} keeps ledger {i} of the northern forge." for i in range(n)
    )
    return [{"role": "system", "content": text}, {"role": "user", "content": "Good morning!"}]


def test_warm_then_next_turn_lands_warm_and_cached(client: httpx.Client) -> None:
    messages = lore("ada")
    r = client.post("/v1/warm", json={"model": MODEL, "messages": messages, "user": "ada"})
    assert r.status_code == 200, r.text
    warm = r.json()
    assert set(warm) == {
        "instance",
        "prompt_tokens",
        "cached_tokens",
        "warmed_tokens",
        "source",
        "ms",
    }
    assert warm["source"] == "engine"
    assert warm["cached_tokens"] == 0  # nothing of this prompt was anywhere before
    assert warm["warmed_tokens"] == warm["prompt_tokens"] > 4 * BLOCK
    full_blocks = (warm["prompt_tokens"] - 1) // BLOCK * BLOCK

    again = client.post("/v1/warm", json={"model": MODEL, "messages": messages, "user": "ada"})
    assert again.status_code == 200, again.text
    assert again.json()["source"] == "held"  # the index knows it is resident now
    assert again.json()["instance"] == warm["instance"]

    sdk = openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="unused", max_retries=0)
    turn = [*messages, {"role": "user", "content": "Have you any horseshoes left?"}]
    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=turn,  # type: ignore[arg-type]
        user="ada",
        max_tokens=4,
    )
    answer = raw.parse()
    assert raw.headers["x-warmgate-instance"] == warm["instance"]
    assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
    cached = answer.usage.prompt_tokens_details.cached_tokens or 0
    assert cached >= 0.9 * full_blocks, (cached, full_blocks)

    metrics = client.get("/metrics").text
    assert 'warmgate_warm_total{outcome="ok",source="engine"}' in metrics
    assert 'warmgate_warm_total{outcome="ok",source="held"}' in metrics
    stats = client.get("/admin/stats").json()["warm"]
    assert stats["by_source"]["engine"]["ok"] >= 1
    assert stats["by_source"]["held"]["ok"] >= 1


def test_warm_takes_completions_bodies_and_the_session_header(client: httpx.Client) -> None:
    prompt = " ".join(f"Ballad verse {i} of the lighthouse keeper." for i in range(60))
    r = client.post(
        "/v1/warm", json={"model": MODEL, "prompt": prompt}, headers={"x-session-id": "bard-7"}
    )
    assert r.status_code == 200, r.text
    assert r.json()["source"] == "engine"
    nxt = client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": prompt + " And the sea rose.", "max_tokens": 2},
        headers={"x-session-id": "bard-7"},
    )
    assert nxt.status_code == 200, nxt.text
    assert nxt.headers["x-warmgate-instance"] == r.json()["instance"]
    assert nxt.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


@pytest.mark.parametrize(
    ("body", "headers", "param"),
    [
        ({"model": MODEL, "messages": lore("x", 2)}, {}, "prompt_cache_key"),  # no session
        ({"model": MODEL, "user": "u"}, {}, "messages"),
        ({"messages": lore("x", 2), "user": "u"}, {}, "model"),
    ],
)
def test_warm_bad_input_is_a_clear_400(
    client: httpx.Client, body: dict[str, Any], headers: dict[str, str], param: str
) -> None:
    r = client.post("/v1/warm", json=body, headers=headers)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"]


def test_warm_unparsable_body_is_400(client: httpx.Client) -> None:
    r = client.post("/v1/warm", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "not valid JSON" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("headers", "param"),
    [
        ({"x-warmgate-ttft-deadline-ms": "soon"}, "x-warmgate-ttft-deadline-ms"),
        ({"x-warmgate-ttft-deadline-ms": "-5"}, "x-warmgate-ttft-deadline-ms"),
        ({"x-warmgate-ttft-deadline-ms": "100", "x-warmgate-deadline-miss": "418"}, None),
        ({"x-warmgate-priority": "urgent"}, "x-warmgate-priority"),
    ],
)
def test_bad_priority_or_deadline_is_400(
    client: httpx.Client, headers: dict[str, str], param: str | None
) -> None:
    body = {"model": MODEL, "messages": lore("b", 1), "max_tokens": 2}
    r = client.post("/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] in ("invalid_deadline", "invalid_priority")
    if param is not None:
        assert err["param"] == param


@pytest.mark.parametrize("status", [429, 503])
def test_unmeetable_deadline_is_answered_at_once(client: httpx.Client, status: int) -> None:
    body = {"model": MODEL, "messages": lore("d", 2), "max_tokens": 2}
    headers = {"x-warmgate-ttft-deadline-ms": "0.001", "x-warmgate-deadline-miss": str(status)}
    before = client.get("/admin/stats").json()["router"]["routed"]
    r = client.post("/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == "deadline_unmeetable"
    assert int(r.headers["retry-after"]) >= 1
    assert client.get("/admin/stats").json()["router"]["routed"] == before  # never dispatched


def test_priority_and_deadline_through_the_sdk(client: httpx.Client) -> None:
    sdk = openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="unused", max_retries=0)
    answer = sdk.chat.completions.create(
        model=MODEL,
        messages=lore("sdk", 2),  # type: ignore[arg-type]
        max_tokens=2,
        extra_body={"priority": "interactive"},
        extra_headers={"x-warmgate-ttft-deadline-ms": "60000"},
    )
    assert answer.choices[0].message.content
    with pytest.raises(openai.RateLimitError) as exc:
        sdk.chat.completions.create(
            model=MODEL,
            messages=lore("sdk", 2),  # type: ignore[arg-type]
            max_tokens=2,
            extra_headers={"x-warmgate-ttft-deadline-ms": "0.001"},
        )
    assert exc.value.code == "deadline_unmeetable"


class Streaming:
    """A real streamed request held open on the slow engine (it is in flight until closed)."""

    def __init__(self, fleet: Fleet, tag: str = "busy", **headers: str) -> None:
        self.client = httpx.Client(base_url=fleet.base, timeout=120)
        body = {
            "model": MODEL,
            "messages": lore(tag, 4),
            "max_tokens": 2000,
            "ignore_eos": True,  # the simulated engine's (and vLLM's): all 2000 tokens
            "stream": True,
        }
        self.cm = self.client.stream("POST", "/v1/chat/completions", json=body, headers=headers)
        self.response = self.cm.__enter__()
        assert self.response.status_code == 200
        self.lines = self.response.iter_lines()  # kept: a dropped iterator closes the stream
        next(self.lines)  # its first chunk: the engine is generating it

    def close(self) -> None:
        self.cm.__exit__(None, None, None)
        self.client.close()


def test_a_busy_instance_defers_warms_and_sheds_background(slow: Fleet) -> None:
    held = Streaming(slow)
    try:
        with httpx.Client(base_url=slow.base, timeout=120) as c:
            r = c.post("/v1/warm", json={"model": MODEL, "messages": lore("eve"), "user": "eve"})
            assert r.status_code == 429, r.text
            assert r.json()["error"]["code"] == "warm_deferred"
            assert int(r.headers["retry-after"]) >= 1
            small = {"model": MODEL, "messages": lore("bg", 1), "max_tokens": 1}
            bg = c.post(
                "/v1/chat/completions", json=small, headers={"x-warmgate-priority": "background"}
            )
            assert bg.status_code == 429, bg.text
            assert bg.json()["error"]["code"] == "background_shed"
            normal = c.post("/v1/chat/completions", json=small)  # real work is never shed
            assert normal.status_code == 200, normal.text
    finally:
        held.close()
    with httpx.Client(base_url=slow.base, timeout=120) as c:
        wait_until(lambda: not c.get("/admin/stats").json()["warm"]["in_flight"], what="idle")
        wait_until(
            lambda: (
                c.post(
                    "/v1/warm", json={"model": MODEL, "messages": lore("eve"), "user": "eve"}
                ).status_code
                == 200
            ),
            what="a warm on the quiet instance",
        )
        stats = c.get("/admin/stats").json()["warm"]["by_source"]["engine"]
        assert stats["deferred"] >= 1 and stats["ok"] >= 1


def _warm_beside_a_real_request(fleet: Fleet, player: str) -> httpx.Response:
    """A warm of a long prefill, and while it computes a real request on the same (only)
    instance: the warm's answer. A warm the admission defers before it computes (the
    engine's load as last scraped still shows an earlier test's work) is sent again."""
    big = {"model": MODEL, "messages": lore(player, 300), "user": player}  # a long prefill
    for _ in range(10):
        out: dict[str, httpx.Response] = {}

        def warm(out: dict[str, httpx.Response] = out) -> None:
            with httpx.Client(base_url=fleet.base, timeout=300) as c:
                out["warm"] = c.post("/v1/warm", json=big)

        thread = threading.Thread(target=warm)
        thread.start()
        try:
            wait_until(
                lambda out=out: fleet.admin("stats")["warm"]["in_flight"] or "warm" in out,
                what="the warm in flight",
            )
            if "warm" in out:  # answered before it was seen computing: deferred
                assert out["warm"].status_code == 429, out["warm"].text
                time.sleep(1.0)
                continue
            with httpx.Client(base_url=fleet.base, timeout=120) as c:
                real = c.post(
                    "/v1/chat/completions",
                    json={"model": MODEL, "messages": lore(f"{player}-r", 1), "max_tokens": 1},
                )
            assert real.status_code == 200, real.text
        finally:
            thread.join(timeout=300)
        return out["warm"]
    raise AssertionError("every warm was deferred before it computed")


def test_a_warm_gives_way_to_a_real_request_then_goes_on(slow: Fleet) -> None:
    r = _warm_beside_a_real_request(slow, "yul")
    assert r.status_code == 200, r.text  # it went on once the real request had its token
    assert r.json()["source"] == "engine"
    assert r.json()["cached_tokens"] == 0  # before warming; its own first part is not counted
    engine = slow.admin("stats")["warm"]["by_source"]["engine"]
    assert engine["yielded"] >= 1 and engine["resumed"] >= 1
    metrics = httpx.get(f"{slow.base}/metrics", timeout=10).text
    assert 'warmgate_warm_total{outcome="resumed",source="engine"}' in metrics


def test_a_warm_that_may_not_resume_ends_with_429(giving_up: Fleet) -> None:
    r = _warm_beside_a_real_request(giving_up, "yan")
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "warm_deferred"
    assert "real request" in r.json()["error"]["message"]
    engine = giving_up.admin("stats")["warm"]["by_source"]["engine"]
    assert engine["yielded"] >= 1 and "resumed" not in engine


def _in_flight(fleet: Fleet) -> float:
    text = httpx.get(f"{fleet.base}/metrics", timeout=10).text
    m = re.search(r"^warmgate_in_flight_requests (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_background_prefills_wait_their_turn_and_real_work_does_not(gated: Fleet) -> None:
    out: dict[str, httpx.Response] = {}
    background = {"x-warmgate-priority": "background"}
    long = {"model": MODEL, "messages": lore("bgl", 300), "max_tokens": 1}  # a long prefill

    def first() -> None:
        with httpx.Client(base_url=gated.base, timeout=300) as c:
            out["first"] = c.post("/v1/chat/completions", json=long, headers=background)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        wait_until(lambda: _in_flight(gated) >= 1, what="the long background prefill in flight")
        small = {"model": MODEL, "messages": lore("bgs", 1), "max_tokens": 1}
        with httpx.Client(base_url=gated.base, timeout=300) as c:
            second = c.post("/v1/chat/completions", json=small, headers=background)
            assert second.status_code == 429, second.text  # its 1 s wait ran out first
            assert second.json()["error"]["code"] == "background_shed"
            assert "background prefill" in second.json()["error"]["message"]
            assert int(second.headers["retry-after"]) >= 1
            normal = c.post("/v1/chat/completions", json=small)  # not a background request
            assert normal.status_code == 200, normal.text
    finally:
        thread.join(timeout=300)
    assert out["first"].status_code == 200, out["first"].text
    with httpx.Client(base_url=gated.base, timeout=300) as c:  # the slot is free again
        r = c.post("/v1/chat/completions", json=small, headers=background)
        assert r.status_code == 200, r.text
    text = httpx.get(f"{gated.base}/metrics", timeout=10).text
    assert re.search(r'^warmgate_requests_total\{outcome="shed"\} 1\.0$', text, re.M), text


def test_a_refused_warm_binds_no_session(busy_pair: Fleet) -> None:
    """A warm refused because its instance is busy leaves the session unbound: bound, the
    player's line would follow it to the busy instance (every warm of a raid sees the same
    loads, and their sessions would herd)."""
    held = [Streaming(busy_pair, tag=f"busy-{i}") for i in range(2)]
    try:
        wait_until(
            lambda: all(i["in_flight"] >= 1 for i in busy_pair.admin("instances")["instances"]),
            what="a real request in flight on both instances",
        )
        with httpx.Client(base_url=busy_pair.base, timeout=120) as c:
            body = {"model": MODEL, "messages": lore("fay"), "user": "fay"}
            r = c.post("/v1/warm", json=body)
            assert r.status_code == 429, r.text
            where = c.get("/admin/sessions/fay").json()
            assert (where.get("binding") or {}).get("bound_instance") is None, where
    finally:
        for h in held:
            h.close()
    with httpx.Client(base_url=busy_pair.base, timeout=120) as c:
        wait_until(
            lambda: c.post("/v1/warm", json=body).status_code == 200, what="a warm once quiet"
        )
        answer = c.post("/v1/warm", json=body).json()  # held now: where the first one ran
        bound = c.get("/admin/sessions/fay").json()["binding"]["bound_instance"]
        assert bound == answer["instance"]  # a warm that ran binds its session
