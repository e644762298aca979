"""sim.engine with its tierd (`--tierd-url`): both real processes on loopback. What the
engine computes is stored in tierd; after the engine's own HBM cache loses it, the engine
loads it back from tierd's arena or from the array instead of recomputing it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.blocks import chain_seed, hash_blocks, render_chat
from tests.support.procs import ManagedProcess, free_port, python_module

MODEL = "sim-qwen2.5-32b"
BLOCK_CHARS = 256


class Stack:
    def __init__(self, engine: str, tierd: str):
        self.engine, self.tierd = engine, tierd


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = Path(tmp_path_factory.mktemp("engine-tierd"))
    (root / "array").mkdir()
    (root / "snap").mkdir()
    tport, eport = free_port(), free_port()
    tierd = ManagedProcess(
        python_module(
            "tierd.cli", "serve",
            "--host", "127.0.0.1", "--port", str(tport),
            "--l1-bytes", str(64 * 1024 * 1024),
            "--array-dir", str(root / "array"),
            "--snapshot-dir", str(root / "snap"),
            "--instance-id", "t0",
        ),
        root / "tierd.log",
    )  # fmt: skip
    engine: ManagedProcess | None = None
    try:
        tierd.wait_http(f"http://127.0.0.1:{tport}/livez")
        engine = ManagedProcess(
            python_module(
                "sim.engine",
                "--port", str(eport), "--instance-id", "e0",
                "--time-scale", "0.001",
                "--tierd-url", f"http://127.0.0.1:{tport}",
            ),
            root / "engine.log",
        )  # fmt: skip
        engine.wait_http(f"http://127.0.0.1:{eport}/health")
        yield Stack(f"http://127.0.0.1:{eport}", f"http://127.0.0.1:{tport}")
    finally:
        if engine is not None:
            engine.stop()
        tierd.stop()


def request(content: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 2,
        "user": "player-1",
    }


def chain_of(body: dict[str, Any]) -> list[int]:
    text = render_chat(body["messages"])
    return hash_blocks(text, seed=chain_seed(MODEL), block_chars=BLOCK_CHARS)


def tier_loaded(client: httpx.Client, tier: str) -> float:
    prefix = f'warmgate_sim_tier_loaded_tokens_total{{model_name="{MODEL}",tier="{tier}"}}'
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_stored(tierd: httpx.Client, chain: list[int]) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        where: dict[str, Any] = tierd.post("/v1/lookup", json={"hashes": chain}).json()
        if where["available"] == len(chain):
            return where
        assert time.monotonic() < deadline, f"engine never stored its slices: {where}"
        time.sleep(0.05)


def test_reused_kv_comes_back_from_tierd_arena_array_and_snapshot(stack: Stack) -> None:
    body = request("The world state of the zone Saltmere, with storms from the west. " * 40)
    chain = chain_of(body)
    assert len(chain) >= 10
    with (
        httpx.Client(base_url=stack.engine, timeout=30) as engine,
        httpx.Client(base_url=stack.tierd, timeout=30) as tierd,
    ):
        first = engine.post("/v1/chat/completions", json=body).json()
        prompt_tokens = first["usage"]["prompt_tokens"]
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        where = wait_stored(tierd, chain)
        assert set(where["tiers"]) == {"GPU"}

        # the engine's HBM forgets it; tierd's arena still has it
        assert engine.post("/reset_prefix_cache").status_code == 200
        again = engine.post("/v1/chat/completions", json=body).json()
        cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= prompt_tokens - BLOCK_CHARS // 4 - 16
        assert cached < prompt_tokens and cached % 16 == 0
        assert tier_loaded(engine, "l2") > 0
        assert (
            again["choices"][0]["message"]["content"] == (first["choices"][0]["message"]["content"])
        )

        # demoted to the array: loaded from there, same result
        evicted = tierd.post("/v1/evict", json={"hashes": None, "tier": "GPU"}).json()
        assert evicted["evicted"] >= len(chain)
        where = tierd.post("/v1/lookup", json={"hashes": chain}).json()
        assert where["available"] == len(chain) and set(where["tiers"]) == {"ARRAY"}
        assert engine.post("/reset_prefix_cache").status_code == 200
        third = engine.post("/v1/chat/completions", json=body).json()
        assert third["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
        assert tier_loaded(engine, "array") > 0

        # only in a cold snapshot: loaded from there
        snap = tierd.post("/v1/snapshot", json={"hashes": chain, "wait": True})
        assert snap.status_code == 200, snap.text
        tierd.post("/v1/evict", json={"hashes": None, "tier": "GPU"})
        tierd.post("/v1/evict", json={"hashes": None, "tier": "ARRAY"})
        where = tierd.post("/v1/lookup", json={"hashes": chain}).json()
        assert where["available"] == len(chain) and set(where["tiers"]) == {"SNAPSHOT"}
        assert engine.post("/reset_prefix_cache").status_code == 200
        cold = engine.post("/v1/chat/completions", json=body).json()
        assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
        assert tier_loaded(engine, "l3") > 0

        # an HBM hit needs no tier at all
        loaded = tier_loaded(engine, "l2") + tier_loaded(engine, "array")
        fourth = engine.post("/v1/chat/completions", json=body).json()
        assert fourth["usage"]["prompt_tokens_details"]["cached_tokens"] >= cached
        assert tier_loaded(engine, "l2") + tier_loaded(engine, "array") == loaded
        tiers = engine.get("/stats").json()["tiers"]
        assert tiers["skipped_lookups"] >= 1 and tiers["corrupt"] == 0
        assert tiers["stored_slices"] >= len(chain)
        stats = tierd.get("/v1/stats").json()
        assert stats["corrupt"] == {} or not any(stats["corrupt"].values())
