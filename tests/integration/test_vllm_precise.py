"""Precise mode in front of two real vLLM engines (tests/support/vllm.py's session fleet).

Every prompt starts with a tag of its own, so no test sees another's blocks; prompts are
1-2k tokens (the engines compute ~300 prompt tokens per second each).
"""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq
from openai import OpenAI

from contracts.kv_events import BlockStored, decode_batch, decode_frames
from gateway.launch.vllm_fleet import VllmFleet
from router.precise import VllmBlockHasher
from sim.players.text import TextSource
from tests.support.vllm import SERVED_MODEL, Gateway, VllmFleets, gateway_for

pytestmark = [pytest.mark.slow, pytest.mark.fleet("vllm")]


def prose(tag: str, tokens: int, seed: int = 0) -> str:
    """Text of about `tokens` tokens of this tokenizer, starting with a tag of its own."""
    return f"[{tag}] " + TextSource(seed).prose(int(tokens * 0.8))


@pytest.fixture(scope="module")
def fleet(vllm_fleets: VllmFleets) -> VllmFleet:
    return vllm_fleets.get()


@pytest.fixture(scope="module")
def gateway(fleet: VllmFleet, tmp_path_factory: pytest.TempPathFactory) -> Any:
    with gateway_for(tmp_path_factory.mktemp("gw"), fleet) as gw:
        yield gw


def client(gw: Gateway) -> OpenAI:
    return OpenAI(base_url=f"{gw.base}/v1", api_key="unused", max_retries=0, timeout=120)


def chat(
    c: OpenAI, messages: list[dict[str, str]], *, stream: bool, **extra: Any
) -> tuple[str, int, int, str]:
    """One chat turn through the SDK: (instance, predicted, reported cached, reply)."""
    body: dict[str, Any] = {"ignore_eos": True, **extra}
    if stream:
        raw = c.chat.completions.with_raw_response.create(
            model=SERVED_MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=body,
        )
        text, usage = "", None
        for chunk in raw.parse():
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage
    else:
        raw = c.chat.completions.with_raw_response.create(
            model=SERVED_MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=6,
            extra_body=body,
        )
        done = raw.parse()
        text, usage = done.choices[0].message.content or "", done.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    reported = usage.prompt_tokens_details.cached_tokens or 0
    return (
        raw.headers["x-warmgate-instance"],
        int(raw.headers["x-warmgate-cached-tokens"]),
        reported,
        text,
    )


def test_multi_turn_players_predicted_equals_reported_every_turn(gateway: Gateway) -> None:
    c = client(gateway)
    players = {
        p: [{"role": "system", "content": prose(f"player-{p}-{uuid.uuid4().hex[:8]}", 1100, p)}]
        for p in range(2)
    }
    seen: list[tuple[int, int, str, int, int]] = []
    for turn in range(3):
        for p, messages in players.items():
            messages.append({"role": "user", "content": f"Turn {turn}: where is the sword?"})
            instance, predicted, reported, reply = chat(c, messages, stream=(turn + p) % 2 == 1)
            seen.append((p, turn, instance, predicted, reported))
            messages.append({"role": "assistant", "content": reply})
    assert all(pred == rep for *_, pred, rep in seen), seen
    later = [rep for _, turn, _, _, rep in seen if turn > 0]
    assert all(rep >= 1024 for rep in later), seen  # the history was reused, not recomputed


def test_streams_closed_right_after_done_are_completed_not_cancelled(gateway: Gateway) -> None:
    """The synchronous SDK closes its connection right after `data: [DONE]`; a raw client
    closing at once makes that race as tight as it can be. Each stream is complete: the
    gateway must count it ok, with the engine's usage."""
    before = gateway.admin("stats")["requests"]
    body = (
        b'{"model": "%s", "stream": true, "max_tokens": 4, "ignore_eos": true, '
        b'"stream_options": {"include_usage": true}, '
        b'"messages": [{"role": "user", "content": "[close-%s] hello"}]}'
    )
    n = 12
    for i in range(n):
        payload = body % (SERVED_MODEL.encode(), f"{uuid.uuid4().hex}-{i}".encode())
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=60) as s:
            s.sendall(head + payload)
            got = b""
            while b"data: [DONE]" not in got:
                data = s.recv(65536)
                assert data, got
                got += data
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        # closed with a reset, before the chunked body's terminator could be read
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = gateway.admin("stats")["requests"]
        if after.get("total", 0) - before.get("total", 0) >= n:
            break
        time.sleep(0.1)
    assert after.get("ok", 0) - before.get("ok", 0) == n, (before, after)
    assert after.get("cancelled", 0) == before.get("cancelled", 0), (before, after)


def _subscribe(endpoint: str) -> tuple[zmq.Context[Any], zmq.Socket[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    time.sleep(0.3)  # a SUB socket hears only what is published after it joined
    return ctx, sub


def _stored_hashes(sub: zmq.Socket[Any], first_tokens: list[int], timeout_s: float) -> list[int]:
    """Block hashes of the BlockStored events whose chain starts with `first_tokens`."""
    deadline = time.monotonic() + timeout_s
    hashes: list[int] = []
    while time.monotonic() < deadline:
        if not sub.poll(200):
            if hashes:
                return hashes
            continue
        batch = decode_batch(decode_frames(sub.recv_multipart()).payload)
        for ev in batch.events:
            if isinstance(ev, BlockStored) and (
                hashes or list(ev.token_ids[: len(first_tokens)]) == first_tokens
            ):
                hashes.extend(ev.block_hashes)
    return hashes


def test_salted_blocks_hash_as_vllm_hashes_them(fleet: VllmFleet, gateway: Gateway) -> None:
    """vLLM keys a salted prompt's first block by ("cache_salt", salt): the hashes warmgate
    computes equal those the engine publishes, and a salted conversation is predicted right."""
    engine = fleet.engines[0]
    text = prose(f"salt-{uuid.uuid4().hex[:8]}", 700)
    tokens = httpx.post(
        f"{engine.url}/tokenize", json={"model": SERVED_MODEL, "prompt": text}, timeout=30
    ).json()["tokens"]
    salt = f"tenant-{uuid.uuid4().hex[:6]}"
    ctx, sub = _subscribe(str(engine.kv_events_endpoint))
    try:
        r = httpx.post(
            f"{engine.url}/v1/completions",
            json={"model": SERVED_MODEL, "prompt": tokens, "max_tokens": 1, "cache_salt": salt},
            timeout=120,
        )
        r.raise_for_status()
        published = _stored_hashes(sub, tokens[:128], timeout_s=10)
    finally:
        ctx.destroy(linger=0)
    hasher = VllmBlockHasher(hash_seed="vllm-none-hash", block_size=128)
    ours = hasher.block_hashes(tokens, cache_salt=salt)
    assert len(ours) == len(tokens) // 128 >= 4
    assert published[: len(ours)] == ours
    assert hasher.block_hashes(tokens)[0] != ours[0]  # the salt isolates

    c = client(gateway)
    messages = [{"role": "user", "content": prose(f"salted-chat-{uuid.uuid4().hex[:8]}", 900)}]
    first = chat(c, messages, stream=False, cache_salt=salt)
    second = chat(c, messages, stream=True, cache_salt=salt)
    other = chat(c, messages, stream=False, cache_salt=salt + "-other")
    assert first[1:3] == (0, 0)
    assert second[1] == second[2] > 0, second
    assert other[1] == other[2] or other[0] != second[0], other
    if other[0] == second[0]:
        assert other[2] == 0  # another salt shares nothing


def _explain(gw: Gateway, body: dict[str, Any]) -> dict[str, int]:
    out = httpx.post(f"{gw.base}/admin/route/explain", json=body, timeout=30).json()
    return {c["instance"]: sum(c["cached_tokens_by_tier"].values()) for c in out["candidates"]}


def test_events_are_applied_and_evictions_remove_blocks(fleet: VllmFleet, gateway: Gateway) -> None:
    """Requests sent straight to an engine (the gateway never routed them) reach the index
    through the engine's KV events; filling its 48-block cache evicts, and the BlockRemoved
    events make the gateway stop predicting what the engine no longer holds."""
    engine = fleet.engines[1]
    bodies = [
        {
            "model": SERVED_MODEL,
            "prompt": prose(f"evict-{i}-{uuid.uuid4().hex[:8]}", 1600, seed=100 + i),
            "max_tokens": 1,
        }
        for i in range(5)
    ]

    def sources() -> dict[str, Any]:
        return httpx.get(f"{gateway.base}/readyz", timeout=10).json()

    r = httpx.post(f"{engine.url}/v1/completions", json=bodies[0], timeout=120)
    assert r.status_code == 200
    reported_prompt = r.json()["usage"]["prompt_tokens"]
    deadline = time.monotonic() + 10
    while _explain(gateway, bodies[0])[engine.id] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _explain(gateway, bodies[0])[engine.id] == (reported_prompt - 1) // 128 * 128
    for body in bodies[1:]:  # 4 x ~16 more blocks than 48 hold: the first prompt's go
        assert httpx.post(f"{engine.url}/v1/completions", json=body, timeout=120).is_success
    time.sleep(0.5)
    predicted = _explain(gateway, bodies[0])[engine.id]
    again = httpx.post(f"{engine.url}/v1/completions", json=bodies[0], timeout=120).json()
    assert predicted == again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert predicted < (reported_prompt - 1) // 128 * 128  # something was evicted
    source = sources()["checks"]["kv_events"]["sources"][engine.id]
    assert source["blocks_removed"] > 0 and source["blocks_stored"] > 0, source


def test_a_block_size_mismatch_is_refused_at_startup(fleet: VllmFleet, tmp_path: Path) -> None:
    """The engines use 128-token blocks; a gateway configured for 16 must not start."""
    from tests.support.procs import free_port
    from tests.support.vllm import gateway_config

    config = gateway_config(
        fleet, free_port(), routing={"precise": {"block_size": 16}}, kv_events={"enabled": False}
    )
    gw = Gateway(tmp_path, config)
    try:
        gw.proc.proc.wait(timeout=60)
        log = gw.proc.tail(80)
        assert gw.proc.proc.returncode not in (None, 0), log
        assert "block_size is 16 but the engines use 128" in log, log
    finally:
        gw.stop()
    adopted = gateway_config(
        fleet,
        free_port(),
        routing={"precise": {"block_size": 16, "adopt_engine_config": True}},
        kv_events={"enabled": False},
    )
    gw = Gateway(tmp_path, adopted).wait_ready()
    try:
        assert "adopts the engines' {'block_size': 128}" in gw.proc.tail(80)
    finally:
        gw.stop()
