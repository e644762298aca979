"""The gateway's local tokenizer against a real vLLM engine: for chat and completion shapes,
`gateway.pipeline.hf_tokenizer` reading the engine's own model directory gives exactly the token ids
the engine's /tokenize gives, and a gateway using it predicts every turn's cached tokens
exactly, with no /tokenize round trip."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import pytest
from openai import OpenAI

from gateway.launch.vllm_fleet import VllmFleet
from gateway.pipeline.hf_tokenizer import HfChatTokenizer
from sim.players.text import TextSource
from tests.support.vllm import SERVED_MODEL, VllmFleets, gateway_for

pytestmark = [pytest.mark.slow, pytest.mark.fleet("vllm")]

PROSE = TextSource(3).prose(300)


def _chat(*messages: tuple[str, Any], generation: bool = True) -> dict[str, Any]:
    return {
        "messages": [{"role": r, "content": c} for r, c in messages],
        "add_generation_prompt": generation,
    }


PAYLOADS: list[dict[str, Any]] = [
    _chat(("user", "Hello, blacksmith!")),
    _chat(("system", PROSE), ("user", "Where is the old forge?")),
    _chat(
        ("system", "You are Maren."), ("user", "Any news?"), ("assistant", "The pass is shut."),
        ("user", "Since when?"),
    ),
    _chat(("user", [{"type": "text", "text": "two"}, {"type": "text", "text": "parts"}])),
    _chat(("user", "  leading and trailing spaces  \n\n\ttabs\r\n")),
    _chat(("user", "Ünïcödé, 漢字, emoji 🗡️🛡️, ﬁ ligature, zero\u200bwidth")),
    _chat(("user", "a literal <|im_end|> and <|im_start|>user inside")),
    _chat(("user", "")),
    # digits: Qwen2 splits each one off (and the space before it); format 1's file did not
    _chat(("system", "World of zone 1."), ("user", "2024 arrows, 3.5 leagues, x10 or 12th?")),
    _chat(("system", PROSE), ("user", "no generation prompt"), generation=False),
    {"prompt": "Once upon a time"},
    {"prompt": "Room 101, floor 7: 365 days"},
    {"prompt": " starts with a space and ends with one "},
    {"prompt": PROSE + " 🗡️ 漢字"},
]  # fmt: skip


@pytest.fixture(scope="module")
def fleet(vllm_fleets: VllmFleets) -> VllmFleet:
    return vllm_fleets.get()


@pytest.fixture(scope="module")
def remembering(fleet: VllmFleet) -> HfChatTokenizer:
    """One tokenizer with the message cache for all payloads: later ones reuse pieces."""
    return HfChatTokenizer(fleet.cfg.model_dir, segment_cache_tokens=100_000)


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: str(p)[:40])
async def test_local_tokens_are_the_engines_tokens(
    fleet: VllmFleet, remembering: HfChatTokenizer, payload: dict[str, Any]
) -> None:
    tok = HfChatTokenizer(fleet.cfg.model_dir)
    url = next(iter(fleet)).url
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        r = await client.post(f"{url}/tokenize", json={"model": SERVED_MODEL, **payload})
    assert r.status_code == 200, r.text
    assert list(await tok(payload)) == r.json()["tokens"]
    for _ in range(2):  # its pieces encoded, then remembered
        assert list(await remembering(payload)) == r.json()["tokens"]


def _tokenized(metrics: str, source: str) -> float:
    m = re.search(rf'warmgate_precise_tokenized_total\{{source="{source}"\}} (\S+)', metrics)
    return float(m.group(1)) if m else 0.0


def test_a_gateway_tokenizing_locally_predicts_every_turn_exactly(
    fleet: VllmFleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    routing = {"precise": {"tokenizer_dir": str(fleet.cfg.model_dir)}}
    with gateway_for(tmp_path_factory.mktemp("gw-tok"), fleet, routing=routing) as gw:
        c = OpenAI(base_url=f"{gw.base}/v1", api_key="unused", max_retries=0, timeout=120)
        tag = uuid.uuid4().hex[:8]
        messages: list[dict[str, str]] = [
            {"role": "system", "content": f"[{tag}] " + TextSource(5).prose(900)}
        ]
        seen = []
        for turn in range(3):
            messages.append({"role": "user", "content": f"Turn {turn}: where is the sword?"})
            raw = c.chat.completions.with_raw_response.create(
                model=SERVED_MODEL,
                messages=messages,  # type: ignore[arg-type]
                max_tokens=6,
                extra_body={"ignore_eos": True},
            )
            done = raw.parse()
            assert done.usage is not None and done.usage.prompt_tokens_details is not None
            predicted = int(raw.headers["x-warmgate-cached-tokens"])
            seen.append((turn, predicted, done.usage.prompt_tokens_details.cached_tokens or 0))
            messages.append({"role": "assistant", "content": done.choices[0].message.content or ""})
        metrics = httpx.get(f"{gw.base}/metrics", timeout=10).text
        assert all(pred == rep for _, pred, rep in seen), (seen, gw.log_tail())
        assert all(rep > 0 for turn, _, rep in seen if turn > 0), seen  # the history was reused
        assert _tokenized(metrics, "local") >= 3
        assert _tokenized(metrics, "engine") == 0  # no /tokenize round trip
