"""Precise mode against real engines: the gateway tokenizes through the engines' /tokenize
and hashes blocks as they do (vLLM's sha256_cbor with the shared hash seed), so what it
predicts cached is exactly what the engine then reports; prompts it cannot tokenize are
routed approximately, and counted."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.fleet import MODEL, Fleet

BLOCK = 16


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(
        tmp_path_factory.mktemp("gw-precise"),
        2,
        engine_args=("--hash-seed", "0", "--block-tokens", str(BLOCK)),
        settings={
            "routing": {"mode": "precise", "precise": {"hash_seed": "0", "block_size": BLOCK}}
        },
    )
    f.start()
    yield f
    f.stop()


def test_predicted_cached_tokens_are_exactly_what_the_engine_reports(fleet: Fleet) -> None:
    messages = [
        {"role": "system", "content": "The world state of Eastvale: the harbor is frozen. " * 30},
        {"role": "user", "content": "Any news from the north?"},
    ]
    body = {"model": MODEL, "messages": messages, "max_tokens": 5, "user": "player-precise"}
    with httpx.Client(base_url=fleet.base, timeout=30) as c:
        first = c.post("/v1/chat/completions", json=body)
        assert first.status_code == 200
        prompt_tokens = first.json()["usage"]["prompt_tokens"]
        second = c.post("/v1/chat/completions", json=body)
        assert second.headers["x-warmgate-instance"] == first.headers["x-warmgate-instance"]
        predicted = int(second.headers["x-warmgate-cached-tokens"])
        reported = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert predicted == reported == (prompt_tokens // BLOCK) * BLOCK
        explained = c.post("/admin/route/explain", json=body).json()["request"]
        assert explained["mode"] == "precise"
        assert explained["block_tokens"] == BLOCK
        assert explained["prompt_tokens"] == prompt_tokens  # real tokens, not an estimate


def test_untokenizable_prompt_is_routed_approximately(fleet: Fleet) -> None:
    with httpx.Client(base_url=fleet.base, timeout=30) as c:
        r = c.post(
            "/v1/completions", json={"model": MODEL, "prompt": ["two", "prompts"], "max_tokens": 2}
        )
        assert r.status_code == 200
        assert "warmgate_precise_fallbacks_total 1.0" in c.get("/metrics").text
        ids = c.post(
            "/v1/completions", json={"model": MODEL, "prompt": list(range(40)), "max_tokens": 2}
        )
        assert ids.status_code == 200  # token ids need no tokenizer
        assert "warmgate_precise_fallbacks_total 1.0" in c.get("/metrics").text
