"""Rate limits with real processes: a player over its requests-per-second budget gets a 429
in the OpenAI shape (the SDK raises RateLimitError) with Retry-After and x-ratelimit-*
headers, other players are untouched; a key over its prompt-token budget gets a `tokens`
429; with Redis the budget is one for every replica: the second replica refuses what the
first already spent."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.e2e.fleet import MODEL, Fleet
from tests.support.procs import ManagedProcess, free_port, python_module


def chat(user: str, content: str = "Hello there") -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 2,
        "user": user,
    }


def test_player_and_key_limits_in_memory(tmp_path: Path) -> None:
    limits = {
        "per_player": {"requests_per_s": 0.05, "burst": 2},
        "per_key": {"prompt_tokens_per_min": 600},
    }
    fleet = Fleet(tmp_path, 1, settings={"limits": limits}).start()
    try:
        client = openai.OpenAI(base_url=f"{fleet.base}/v1", api_key="k1", max_retries=0)
        for _ in range(2):
            client.chat.completions.create(**chat("alice"))
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(**chat("alice"))
        r = info.value.response
        assert r.status_code == 429
        err = r.json()["error"]
        assert err["type"] == "requests" and err["code"] == "rate_limit_exceeded"
        assert "player" in err["message"]
        assert int(r.headers["retry-after"]) >= 1
        assert int(r.headers["retry-after-ms"]) > 1000
        assert r.headers["x-ratelimit-limit-requests"] == "2"
        assert r.headers["x-ratelimit-remaining-requests"] == "0"
        assert r.headers["x-ratelimit-reset-requests"].endswith("s")
        client.chat.completions.create(**chat("bob"))
        # ~500 prompt tokens each: the key's 600 per minute take one such prompt
        big = "w" * 2000
        ok = httpx.post(
            f"{fleet.base}/v1/chat/completions",
            json=chat("carol", big),
            headers={"authorization": "Bearer k2"},
        )
        assert ok.status_code == 200, ok.text
        r2 = httpx.post(
            f"{fleet.base}/v1/chat/completions",
            json=chat("dave", big),
            headers={"authorization": "Bearer k2"},
        )
        assert r2.status_code == 429
        assert r2.json()["error"]["type"] == "tokens"
        assert "x-ratelimit-remaining-tokens" in r2.headers
        client.close()
    finally:
        fleet.stop()


def test_a_player_limit_holds_across_replicas_through_redis(tmp_path: Path, redis_url: str) -> None:
    pool = f"rl-{uuid.uuid4().hex[:8]}"
    settings = {
        "state": {"backend": "redis", "redis_url": redis_url, "pool": pool},
        "limits": {"per_player": {"requests_per_s": 0.05, "burst": 1}},
    }
    fleet = Fleet(tmp_path, 1, settings=settings).start()
    second: ManagedProcess | None = None
    try:
        config = yaml.safe_load((tmp_path / "gateway.yaml").read_text())
        port = free_port()
        config["port"] = port
        path = tmp_path / "gateway-b.yaml"
        path.write_text(yaml.safe_dump(config))
        second = ManagedProcess(
            python_module("gateway.launch.serve", "--config", str(path)), tmp_path / "gateway-b.log"
        )
        other = f"http://127.0.0.1:{port}"
        second.wait_http(f"{other}/readyz", timeout_s=60)
        first = httpx.post(f"{fleet.base}/v1/chat/completions", json=chat("eve"), timeout=30)
        assert first.status_code == 200, first.text
        again = httpx.post(f"{other}/v1/chat/completions", json=chat("eve"), timeout=30)
        assert again.status_code == 429, again.text
        assert int(again.headers["retry-after"]) >= 1
        fresh = httpx.post(f"{other}/v1/chat/completions", json=chat("frank"), timeout=30)
        assert fresh.status_code == 200
    finally:
        if second is not None:
            second.stop()
        fleet.stop()
