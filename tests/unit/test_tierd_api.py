"""tierd's HTTP API in-process (the real app, its lifespan, real files) through the real
`TierdClient`: status codes, error shapes, fire-and-forget hints, metrics."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tierd.api import create_app
from tierd.client import TierdClient, TierdError
from tierd.daemon import Daemon
from tierd.settings import TierdSettings

BASE = "http://tierd.test"


def data_of(h: int) -> bytes:
    return random.Random(h).randbytes(1500)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[TierdClient, httpx.AsyncClient, Daemon]]:
    settings = TierdSettings(
        array_dir=tmp_path / "a",
        snapshot_dir=tmp_path / "s",
        l1_bytes=8 * 4096,
        slice_bytes=4096,
        instance_id="api-test",
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        daemon: Daemon = app.state.daemon
        await daemon.wait_ready()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
            client = TierdClient(BASE, client=http)
            yield client, http, daemon
            await client.aclose()


async def test_errors_have_the_openai_shape_and_right_status(
    api: tuple[TierdClient, httpx.AsyncClient, Daemon],
) -> None:
    client, http, _ = api
    r = await http.get("/v1/slices/not-a-hash")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_hash"
    r = await http.get(f"/v1/slices/{2**64}")
    assert r.status_code == 400
    r = await http.get("/v1/slices/12345")
    assert r.status_code == 404 and r.json()["error"]["code"] == "slice_not_found"
    assert await client.get_slice(12345) is None
    with pytest.raises(TierdError) as too_big:
        await client.put_slice(5, b"\0" * 4097)
    assert too_big.value.status == 413
    r = await http.post("/v1/evict", json={"tier": "HBM"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tier"
    r = await http.post("/v1/lookup", json={"hashes": [-1]})
    assert r.status_code == 422
    # a token count past the header's 32 bits (found by bench fuzz: was a 500)
    for where in ({"params": {"tokens": str(2**32)}}, {"headers": {"x-tierd-tokens": str(2**40)}}):
        r = await http.put("/v1/slices/0x69", content=b"abc", **where)  # type: ignore[arg-type]
        assert r.status_code == 422, r.text
    assert (await http.get("/livez")).status_code == 200
    assert (await http.get("/readyz")).json()["ready"] is True


async def test_put_get_hint_snapshot_and_metrics(
    api: tuple[TierdClient, httpx.AsyncClient, Daemon],
) -> None:
    client, http, daemon = api
    chain = [101, 102, 103]
    parent = None
    for h in chain:
        assert await client.put_slice(h, data_of(h), parent=parent, tokens=32, session="p")
        parent = h
    assert not await client.put_slice(101, data_of(101))  # already there
    r = await http.put("/v1/slices/0x68", content=b"abc", headers={"x-tierd-tokens": "3"})
    assert r.status_code == 201 and r.json()["hash"] == 0x68
    assert daemon.store.l1.entry(0x68) is not None
    assert daemon.store.l1.entry(0x68).meta.tokens == 3  # type: ignore[union-attr]
    assert await client.evict(chain) == 3
    assert (await client.lookup(chain))["leading"] == {"GPU": 0, "ARRAY": 3, "SNAPSHOT": 0}
    await client.prefetch(chain, deadline_s=5.0, session="p")
    await daemon.drain()
    assert (await client.lookup(chain))["leading"]["GPU"] == 3
    assert [await client.get_slice(h) for h in chain] == [data_of(h) for h in chain]
    snap = await client.snapshot(chain, wait=True)
    assert snap["slices"] == 3 and snap["id"]
    stats = await client.stats()
    assert stats["prefetch"]["on_time"] == 3 and stats["hits"]["l1"] == 3
    assert stats["tiers"]["snapshot"]["slices"] == 3
    text = (await http.get("/metrics")).text
    assert 'tierd_prefetch_slices_total{instance="api-test",outcome="on_time"} 3.0' in text
    assert 'tierd_hits_total{instance="api-test",tier="l1"} 3.0' in text
    assert 'tierd_tier_slices{instance="api-test",tier="snapshot"} 3.0' in text
    assert "tierd_bytes_moved_total" in text and "tierd_evictions_total" in text


def test_serve_flags_override_env_twins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tierd.serve import build_parser, settings_from_args

    monkeypatch.setenv("WARMGATE_TIERD__L1_BYTES", "12345678")
    monkeypatch.setenv("WARMGATE_TIERD__POOL", "from-env")
    monkeypatch.setenv("WARMGATE_TIERD__INSTANCE_ID", "env-id")
    args = build_parser().parse_args(
        ["--port", "9", "--array-dir", str(tmp_path), "--instance-id", "flag-id", "--fsync"]
    )
    s = settings_from_args(args)
    assert (s.port, s.l1_bytes, s.pool, s.instance_id) == (9, 12345678, "from-env", "flag-id")
    assert s.array_dir == tmp_path and s.fsync is True
    assert settings_from_args(build_parser().parse_args([])).fsync is False
    cfg = tmp_path / "tierd.yaml"
    cfg.write_text("l1-bytes: 777\nport: 1234\nsnapshot_bytes: 99\npool: yaml\n")
    s = settings_from_args(build_parser().parse_args(["--config", str(cfg), "--port", "5"]))
    # flags over env over YAML over defaults, as the gateway's settings
    assert (s.l1_bytes, s.port, s.snapshot_bytes, s.pool) == (12345678, 5, 99, "from-env")
    monkeypatch.delenv("WARMGATE_TIERD__L1_BYTES")
    assert settings_from_args(build_parser().parse_args(["--config", str(cfg)])).l1_bytes == 777
