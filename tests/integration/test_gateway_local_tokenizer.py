"""Precise mode with `routing.precise.tokenizer_dir` in front of simulated engines: requests
the local tokenizer reproduces are tokenized by the gateway itself, and one its chat
template refuses goes to an engine's /tokenize instead, each counted by source; both are
answered. (Token-for-token agreement with a real engine: test_vllm_tokenizer.py.)"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.fleet import MODEL, Fleet
from tests.support.hf_tokenizer_dir import CHATML, build

REFUSING = (
    "{% for message in messages %}{% if 'engine-only' in message['content'] %}"
    "{{ raise_exception('not rendered here') }}{% endif %}{% endfor %}" + CHATML
)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("gw-local-tok")
    directory = build(tmp / "tokenizer", template=REFUSING)
    precise = {"hash_seed": "0", "block_size": 16, "tokenizer_dir": str(directory)}
    f = Fleet(
        tmp, 1, engine_args=("--hash-seed", "0", "--block-tokens", "16"),
        settings={"routing": {"mode": "precise", "precise": precise}},
    )  # fmt: skip
    f.start()
    yield f
    f.stop()


def _count(metrics: str, source: str) -> float:
    m = re.search(rf'warmgate_precise_tokenized_total\{{source="{source}"\}} (\S+)', metrics)
    return float(m.group(1)) if m else 0.0


def test_local_first_then_the_engine_for_what_it_refuses(fleet: Fleet) -> None:
    def ask(content: str) -> httpx.Response:
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
                "max_tokens": 3}  # fmt: skip
        return c.post("/v1/chat/completions", json=body)

    with httpx.Client(base_url=fleet.base, timeout=30) as c:
        assert ask("Where is the old forge?").status_code == 200
        metrics = c.get("/metrics").text
        assert (_count(metrics, "local"), _count(metrics, "engine")) == (1, 0)
        assert ask("an engine-only question").status_code == 200
        metrics = c.get("/metrics").text
        assert (_count(metrics, "local"), _count(metrics, "engine")) == (1, 1)
        assert "warmgate_precise_fallbacks_total 0.0" in metrics  # precise both times
        ids = {"model": MODEL, "prompt": list(range(40)), "max_tokens": 2}
        assert c.post("/v1/completions", json=ids).status_code == 200
        assert _count(c.get("/metrics").text, "ids") == 1
